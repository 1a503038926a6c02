// Package neli elects one leader among contending processes through a Kafka consumer group,
// using Fast NELI (Non-Exclusive Leader Inference): whichever member Kafka assigns partition 0 of
// the leader topic is the leader. It needs nothing but Kafka, and is useful on its own, for any
// work that one process of a group should do at a time.
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
//
// # States
//
//	               partition 0 assigned
//	+----------+  -- LeaderAcquired -->  +--------+
//	| Follower |                         | Leader |
//	+----------+  <-- LeaderRevoked --   +--------+
//	     ^          (rebalance, Close)       |
//	     |                                   | no own heartbeat back
//	     |                                   | within HeartbeatTimeout
//	     |                                   v -- LeaderFenced (Barrier runs)
//	     |   rejoin: LeaderRevoked      +--------+
//	     +----------------------------  | Fenced |
//	                                    +--------+
//
// A Leader publishes a heartbeat to partition 0 on every pulse and reads it back through its
// consumer. IsLeader is true only while partition 0 is assigned and the newest heartbeat read
// back was sent less than HeartbeatTimeout ago; because it consults the clock, a leader whose
// loop stalls (a GC pause, a stuck callback, a frozen process) reads as fenced on time even
// though nothing runs to notice. When the loop does notice, it emits LeaderFenced, runs the
// Barrier, and leaves and rejoins the group. Reading its own heartbeat shows only that the leader
// still reaches the partition, not that the group still counts it as a member, so a fenced
// leader is never restored in place: leadership returns only through a fresh assignment.
//
// # Safety
//
// The leader must fence itself before any other member can be assigned partition 0. NELI owns
// the consumer's group timings and derives them from HeartbeatTimeout (H):
//
//	session.timeout.ms    = 2H
//	max.poll.interval.ms  = 2H
//	heartbeat.interval.ms = H/10
//
// A leader cut off from Kafka at time t read its last heartbeat no later than t, so it is fenced
// by t+H. The coordinator heard from it no earlier than t-H/10, so it evicts it no earlier than
// t+2H-H/10 = t+1.9H, and only then can another member be assigned. The short heartbeat interval
// also tells followers of a rebalance quickly, which keeps a graceful handover well under a second
// or two. A leader whose loop stalls at
// t reads no heartbeat after t and is fenced by t+H, while librdkafka leaves the group only at
// t+2H. A graceful handover (a rebalance, or Close) revokes the leader, and runs Barrier, before
// the group can reassign, because the eager protocol waits for every member to give up its
// partitions first.
//
// The Barrier is that handover's budget. After a revoke it runs inside the rebalance, which waits
// for it for at most max.poll.interval.ms = 2H before it evicts the member and reassigns partition
// 0 anyway; after a fence (at t+H at the latest, above) it has until the coordinator can evict
// the member, t+1.9H, so 0.9H. A Barrier must return within that, whatever the state of the
// systems the leader's work depends on. goharvest's returns within about its MaxPollInterval, at
// most H/2: every wait of an ending epoch ends by one deadline, and so does the one kind of call
// that cannot be cancelled (a transactional call to librdkafka, which honours only a timeout and
// is never given more than MaxPollInterval). Work that is slow to start (a producer's
// InitTransactions) runs off the loop, so that Pulse is called on time throughout.
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
