// Package neli elects leaders among contending processes through a Kafka consumer group, using
// Fast NELI (Non-Exclusive Leader Inference): whichever member Kafka assigns a partition of the
// leader topic leads it. With one partition (the default) that makes one leader; with N, the
// group spreads N leaderships over its members, for work split N ways. It needs nothing but
// Kafka, and is useful on its own, for any work that one process of a group should do at a time.
//
// # Usage
//
//	n, err := neli.New(neli.Config{
//		KafkaConfig:   map[string]any{"bootstrap.servers": "localhost:9092"},
//		LeaderTopic:   "billing-api.leader",
//		LeaderGroupID: "billing-api",
//		Name:          hostname,
//		OnEvent:       func(e neli.Event) { log.Println(e) },
//	})
//	...
//	go n.Run(ctx)          // or call n.Pulse(ctx) yourself every MinPollInterval
//	if n.IsLeader() { ... } // consult before every piece of leader-only work
//	n.Partitions()          // with Config.Partitions > 1: which of the N this contender leads
//
// # States
//
// Each partition goes through these states on its own (the events name the partitions):
//
//	             partition assigned
//	+----------+  -- Acquired -->  +--------+
//	| Follower |                   | Leader |
//	+----------+  <-- Revoked --   +--------+
//	     ^      (rebalance, Close)      |
//	     |                              | no heartbeat acknowledged
//	     |                              | within HeartbeatTimeout
//	     |                              v -- SelfFenced (Barrier runs)
//	     |   rejoin: Revoked       +--------+
//	     +-----------------------  | Fenced |
//	                               +--------+
//
// A Leader sends heartbeats to the partitions it leads, a few each tenth of the heartbeat timeout,
// and counts one once the partition's leader broker acknowledges it. IsLeader is true only while a
// partition is assigned and the newest acknowledged heartbeat was sent less than HeartbeatTimeout
// ago; because it consults the clock, a leader whose loop stalls (a GC pause, a stuck callback, a
// frozen process) reads as fenced on time even though nothing runs to notice. When the loop does
// notice, it emits SelfFenced, runs the Barrier, and leaves and rejoins the group. A heartbeat
// shows only that the leader still reaches Kafka, not that the group still counts it as a member,
// so a fenced leader is never restored in place: leadership returns only through a fresh
// assignment.
//
// # Safety
//
// The leader must fence itself before any other member can be assigned its partitions. NELI owns
// the consumer's group timings and derives them from HeartbeatTimeout (H):
//
//	session.timeout.ms    = 2H
//	max.poll.interval.ms  = 2H
//	heartbeat.interval.ms = H/10
//
// A leader cut off from Kafka at time t had its last heartbeat acknowledged no later than t, and
// that heartbeat was sent before it was acknowledged, so the leader is fenced by t+H. The
// coordinator heard from it no earlier than t-H/10, so it evicts it no earlier than
// t+2H-H/10 = t+1.9H, and only then can another member be assigned. The short heartbeat interval
// also tells followers of a rebalance quickly, which keeps a graceful handover well under a second
// or two. A leader whose loop stalls at t takes no acknowledgement after t and is fenced by t+H,
// while librdkafka leaves the group only at t+2H. A graceful handover (a rebalance, or Close) revokes the leader, and runs Barrier, before
// the group can reassign: under the cooperative protocol a partition that is to move is first
// taken from its owner, and assigned to its new owner only in a later round, once the old one has
// rejoined without it. The cooperative-sticky assignor also keeps the partitions balanced (3
// members, 8 partitions: 3, 3 and 2) and moves as few as it can when a member joins or leaves;
// the partitions that stay keep their leader through the rebalance.
//
// The Barrier is that handover's budget. After a revoke it runs inside the rebalance, which waits
// for it for at most max.poll.interval.ms = 2H before it evicts the member and reassigns its
// partitions anyway; after a fence (at t+H at the latest, above) it has until the coordinator can evict
// the member, t+1.9H, so 0.9H. A Barrier must return within that, whatever the state of the
// systems the leader's work depends on. goharvest's returns within about its MaxPollInterval, at
// most H/2: every wait of an ending epoch ends by one deadline, and so does the one kind of call
// that cannot be cancelled (a transactional call to librdkafka, which honours only a timeout and
// is never given more than MaxPollInterval). Work that is slow to start (a producer's
// InitTransactions) runs off the loop, so that Pulse is called on time throughout.
//
// What counts as a heartbeat is the acknowledgement of the broker that leads its partition
// (acks=1): it shows that the contender reached Kafka at or after the moment the heartbeat was
// sent, which is all the arithmetic above uses. Nobody reads heartbeats, so whether the other
// replicas have them does not matter, and asking for more costs leadership for nothing: a record
// is acknowledged with acks=all, and is visible to a consumer (below the high watermark), only
// once every in-sync replica has it, and a broker that crashed stays in sync until the controller
// fences it (broker.session.timeout.ms, 9s by default), longer than the default heartbeat
// timeout, so that any broker's crash would fence every leader. With acks=1 a broker's crash
// fences only a leader all of whose heartbeat partitions it led: heartbeats go to up to three of
// the leader's partitions a round, taken in turn, and any one acknowledged counts.
//
// The group coordinator's crash does not break the arithmetic either: the coordinator that takes
// over does not know when each member was last heard from, and gives every member a full session
// from when it loaded the group. But librdkafka counts its own session from its last answered
// heartbeat, and when the takeover outlasts that session (the controller fences a crashed broker
// after 9s by default, against a 10s session) it drops its assignment (Revoked) and joins again.
// A contender's membership is static (KIP-345), under an identity of its own (see
// Config.instanceID), so that it joins again in its old membership's place and the group is whole
// as soon as the new coordinator serves; a dynamic member would join as a new one, and the group
// would wait a whole session for the old membership to expire. (When a request of the old
// membership is still under way as it joins again, the coordinator answers it FENCED_INSTANCE_ID,
// which librdkafka makes fatal; the contender replaces its consumer and joins in the same place.)
// The revoke and the fresh assignment keep the order of the state machine above: the contender
// leads again only through the new assignment, and no other contender is given its partitions
// meanwhile.
//
// An acknowledgement shows that the contender reaches the partition's leader, not that it reaches
// the coordinator. A contender cut off from the coordinator alone keeps leading until librdkafka's
// own session runs out, at about the moment the coordinator evicts it, and the two moments are
// not ordered. Work that must never overlap is fenced where it lands as well: goharvest's
// producers share one transactional ID per shard, so a successor's InitTransactions fences its
// predecessor's producer at the broker, whatever the predecessor believes.
//
// What NELI cannot do is stop work the old leader had already started: a message handed to a
// producer before the fence can still be delivered after it. Callers that need a hard guarantee
// check IsLeader before each unit of work, use Barrier to finish or abandon work in flight, and
// (where the work writes to a store) fence by a token the store checks.
//
// # Events
//
// Events are delivered to Config.OnEvent in the order they happen, on a goroutine of their own:
// a slow handler delays later events but never the election. Barrier, by contrast, runs on the
// loop and delays the handover until it returns, which is what lets a leader finish its work
// before another starts.
package neli
