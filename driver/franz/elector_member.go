package franz

// The election's membership of the group: a member's kgo group client and its options, the
// rebalance callbacks it hands to Pulse, its group heartbeats on the process's wake grid, the
// watchdog that lets it go when the loop stalls, and its leaving, asked again when lost.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest/internal/leadership"
	"github.com/goharvest/goharvest/internal/wakegrid"
)

// member is one membership of the group: a kgo group client, whose rebalance callbacks hand each
// change to Pulse and wait until Pulse has applied it (and run the Barrier), so that the group
// reassigns a revoked partition only after its Barrier returned.
type member struct {
	cl      *kgo.Client
	changes chan change
	// posting counts the callbacks waiting for Pulse to take their change: the loop may not rest
	// while one does, since the wake it signalled may have been spent by a Pulse that came too
	// early to take the change.
	posting atomic.Int32
	// retired is closed when the loop lets the member go: its callbacks then return at once.
	retired    chan struct{}
	retireOnce sync.Once
	closeOnce  sync.Once
	closed     chan struct{} // closed once cl.Close has returned
	// joining counts the member's JoinGroup and SyncGroup requests in flight (see joinHook).
	joining atomic.Int32
	// stopBeats ends beatGroup, which closes beatsDone once it has returned.
	stopBeats context.CancelFunc
	beatsDone chan struct{}
}

// change is one of kgo's rebalance callbacks.
type change struct {
	assigned   bool // else revoked or lost
	partitions []int32
	// inTopic is how many partitions the leader topic had when the group assigned (0 when
	// unknown: the metadata request failed).
	inTopic int
	done    chan struct{}
}

// join makes sure the leader topic is ready, then joins the group with a new member. After a
// fence it first waits for the old member to have left, and lets go of what it held.
func (e *elector) join(ctx context.Context) error {
	if e.leaving != nil {
		select {
		case <-e.leaving:
		default:
			return nil
		}
		e.leaving = nil
		e.contender.RevokeAll()
	}
	if ready, err := e.contender.PrepareTopic(func() error { return e.prepareTopic(ctx) }); !ready {
		return err
	}
	m := &member{changes: make(chan change), retired: make(chan struct{}), closed: make(chan struct{}), beatsDone: make(chan struct{})}
	cl, err := kgo.NewClient(e.groupOpts(m)...)
	if err != nil {
		return fmt.Errorf("franz: create election consumer: %w", err)
	}
	// Heartbeats are not read back: a leader's evidence is their acknowledgement.
	cl.PauseFetchTopics(e.cfg.LeaderTopic)
	m.cl = cl
	e.member = m
	// Before the watchdog starts: it may close the member, which stops the heartbeats.
	var beats context.Context
	beats, m.stopBeats = context.WithCancel(context.Background())
	go e.beatGroup(beats, m)
	go e.watch(m)
	e.log.Info("joined the election", "topic", e.cfg.LeaderTopic)
	return nil
}

func (e *elector) groupOpts(m *member) []kgo.Opt {
	h := e.cfg.HeartbeatTimeout
	post := func(assigned bool) func(context.Context, *kgo.Client, map[string][]int32) {
		return func(ctx context.Context, cl *kgo.Client, parts map[string][]int32) {
			c := change{assigned: assigned, partitions: slices.Sorted(slices.Values(parts[e.cfg.LeaderTopic]))}
			// A rebalance may come from a contender that grew the leader topic: the group's
			// leader must see the new partitions, and rejoins to assign them once it does.
			cl.ForceMetadataRefresh()
			if assigned {
				c.inTopic = e.partitionsInTopic(ctx)
			}
			m.post(c, e.poke)
		}
	}
	// The client ID and backoff first, so that those of the user's (in opts) win. kgo gives up on
	// a request after RequestRetries tries (20) whatever the time: at the election's short waits
	// that would end a heartbeat's retries four seconds into a coordinator's move rather than at
	// the end of the session, which can outlast the move. Time alone bounds them instead: the
	// session for the group's requests, kgo's 30s for the others.
	opts := append([]kgo.Opt{kgo.ClientID(e.cfg.Name), kgo.RetryBackoffFn(backoff(DefaultRetryBackoff, DefaultElectionRetryBackoffMax)),
		kgo.RequestRetries(math.MaxInt32)}, e.opts...)
	return append(opts,
		kgo.SeedBrokers(e.seeds...),
		kgo.ConsumerGroup(e.cfg.LeaderGroupID),
		kgo.ConsumeTopics(e.cfg.LeaderTopic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.SessionTimeout(2*h),
		kgo.RebalanceTimeout(2*h),
		// The member's heartbeats are beatGroup's, on the process's wake grid; kgo's own, at
		// three quarters of the session, back them up (see beatGroup).
		kgo.HeartbeatInterval(max(time.Millisecond, 3*h/2)),
		kgo.DisableAutoCommit(),
		// Nothing is read from the leader topic (its fetches are paused; see join); should a
		// fetch start anyway, it starts at the end.
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()),
		kgo.OnPartitionsAssigned(post(true)),
		kgo.OnPartitionsRevoked(post(false)),
		kgo.OnPartitionsLost(post(false)),
		// See electionMetadataMaxAge.
		kgo.MetadataMaxAge(electionMetadataMaxAge),
		kgo.MetadataMinAge(100*time.Millisecond),
		kgo.WithHooks(groupErrorHook{e}, joinHook{m}),
		kgo.WithLogger(slogLogger{e.log}),
	)
}

// electionMetadataMaxAge is how old a member's metadata may grow. What a member needs of it is
// the leader topic's partitions: as the group's leader it assigns from them, and kgo's leader
// rejoins when they grow. The topic grows only when a contender configured with more partitions
// joins, and the join's rebalance refreshes every member's metadata whose assignment it changes
// (see groupOpts), so the periodic refresh is a backstop. A refresh every heartbeat timeout
// cost an idle reaper of 50 outboxes about half a percent of a core.
const electionMetadataMaxAge = time.Minute

// groupErrorHook takes a member's group management errors, which kgo otherwise only logs.
type groupErrorHook struct{ e *elector }

func (h groupErrorHook) OnGroupManageError(err error) {
	h.e.groupErr.Lock()
	h.e.groupErr.err = err
	h.e.groupErr.Unlock()
	h.e.poke()
}

// checkGroupError returns the group management error that retrying cannot cure (a permission
// taken away while the election runs), and logs any other.
func (e *elector) checkGroupError() error {
	e.groupErr.Lock()
	err := e.groupErr.err
	e.groupErr.err = nil
	e.groupErr.Unlock()
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.GroupAuthorizationFailed):
		e.contender.Stop(e.contender.Refused(leadership.JoinGroup, err))
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		e.contender.Stop(e.contender.Refused(leadership.ReadTopic, err))
	case errors.Is(err, kerr.InvalidSessionTimeout):
		// The session is twice the heartbeat timeout (see NewElector), and the broker allows
		// only sessions within [group.min.session.timeout.ms, group.max.session.timeout.ms],
		// 6s to 30m by default: retrying cannot cure that.
		e.contender.Stop(fmt.Errorf("franz: group %s: the broker refuses a session of %v, twice the heartbeat timeout %v (%w): "+
			"set the heartbeat timeout to half a session the broker allows (group.min.session.timeout.ms, 6s by default, needs 3s or more)",
			e.cfg.LeaderGroupID, 2*e.cfg.HeartbeatTimeout, e.cfg.HeartbeatTimeout, err))
	default:
		e.contender.KafkaFailed("group", err)
	}
	return e.contender.Err()
}

// joinHook counts a member's JoinGroup and SyncGroup requests from when kgo has written one until
// its answer (or the connection's failure) has come, so that beatGroup can tell that kgo is
// already joining the group. A count that stayed up (a request whose end kgo never reported)
// would only leave the member to kgo's own heartbeats.
type joinHook struct{ m *member }

func joinOrSync(key int16) bool { return key == int16(kmsg.JoinGroup) || key == int16(kmsg.SyncGroup) }

func (h joinHook) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err == nil && joinOrSync(key) {
		h.m.joining.Add(1)
	}
}

func (h joinHook) OnBrokerE2E(_ kgo.BrokerMetadata, key int16, e2e kgo.BrokerE2E) {
	if e2e.WriteErr == nil && joinOrSync(key) {
		h.m.joining.Add(-1)
	}
}

// beatGroup sends m's group heartbeats every tenth of the heartbeat timeout (the rate at which a
// member learns of a rebalance), at the points of the process's wake grid (package wakegrid),
// until ctx ends. kgo sends a member's heartbeats each on its own clock, which drifts by each
// answer's time: 50 outboxes' members woke an idle reaper 100 times a second at scattered
// instants; on the grid they beat together (operations.md, Resources per outbox). They keep the
// member's session as kgo's did, so the coordinator still hears from a member at most a tenth of
// the timeout before it is cut off (neli/doc.go, Safety).
//
// kgo's own heartbeats go on, at three quarters of the session (at a quarter, their own clocks
// cost most of what this saves), and act on any error as before: a member expired or fenced
// loses its partitions, now up to 1.5 heartbeat timeouts later, and meanwhile a successor's
// InitTransactions fences its producer, as in any split brain. This one acts only on a
// rebalance, which it makes kgo join at once (ForceRebalance), as kgo's own heartbeat would
// have; but not while kgo is already joining or syncing, or has moved to another generation
// since this heartbeat's, since a rejoin asked then starts one more rebalance once this one
// ends, and a heartbeat in that one would ask again. (The instant between a join's answer and
// the sync's request is left open: a rejoin asked in it costs one more rebalance.)
func (e *elector) beatGroup(ctx context.Context, m *member) {
	defer close(m.beatsDone)
	every := max(time.Millisecond, e.cfg.HeartbeatTimeout/10)
	for wakegrid.Wait(ctx, every) {
		memberID, generation := m.cl.GroupMetadata()
		if memberID == "" || generation < 0 {
			continue // not in the group yet
		}
		req := kmsg.NewPtrHeartbeatRequest()
		req.Group, req.MemberID, req.Generation = e.cfg.LeaderGroupID, memberID, generation
		beatCtx, cancel := context.WithTimeout(ctx, every)
		resp, err := req.RequestWith(beatCtx, m.cl)
		cancel()
		if err != nil || !errors.Is(kerr.ErrorForCode(resp.ErrorCode), kerr.RebalanceInProgress) {
			continue
		}
		if id, now := m.cl.GroupMetadata(); id == memberID && now == generation && m.joining.Load() == 0 {
			m.cl.ForceRebalance()
		}
	}
}

// post hands c to Pulse, waking it, and waits until it is applied, or until the member is let go.
func (m *member) post(c change, wake func()) {
	c.done = make(chan struct{})
	m.posting.Add(1)
	wake()
	select {
	case m.changes <- c:
		m.posting.Add(-1)
	case <-m.retired:
		m.posting.Add(-1)
		return
	}
	select {
	case <-c.done:
	case <-m.retired:
	}
}

func (m *member) retire() { m.retireOnce.Do(func() { close(m.retired) }) }

func (m *member) isRetired() bool {
	select {
	case <-m.retired:
		return true
	default:
		return false
	}
}

// close closes the member's client in the background; m.closed says when it is done. kgo's Close
// revokes every partition (the callbacks) and then leaves the group. A leave kgo gave up on (the
// coordinator crashed, say) is handed to lost, with the member's ID, once the client is closed.
func (m *member) close(lost func(memberID string)) {
	m.closeOnce.Do(func() {
		go func() {
			defer close(m.closed)
			// No heartbeat of beatGroup's may make kgo rejoin once the member is leaving.
			m.stopBeats()
			<-m.beatsDone
			memberID, _ := m.cl.GroupMetadata()
			err := m.cl.LeaveGroupContext(context.Background())
			m.cl.Close()
			if err != nil && memberID != "" {
				lost(memberID)
			}
		}()
	})
}

// watch lets m go once Pulse has not been called for two heartbeat timeouts, as librdkafka's
// max.poll.interval.ms does for neli: kgo keeps a member in the group from a goroutine of its
// own, so a contender whose loop stalled would keep its partitions from everyone (it reads as
// fenced after one timeout, and does not publish). Letting the member go leaves the group, and
// the others are given its partitions. The loop, should it resume, finds the member let go and
// joins again (see stalled).
func (e *elector) watch(m *member) {
	limit := 2 * e.cfg.HeartbeatTimeout
	// A timer set for when the limit would pass, not a ticker: a loop that keeps pulsing costs
	// this goroutine one wake every limit, not several.
	timer := time.NewTimer(limit)
	defer timer.Stop()
	for {
		select {
		case <-m.retired:
			return
		case <-m.closed:
			return
		case <-timer.C:
			since := time.Since(time.Unix(0, e.lastPulse.Load()))
			if since <= limit {
				timer.Reset(limit - since + time.Millisecond)
				continue
			}
			e.log.Warn("the election loop has not pulsed for two heartbeat timeouts; leaving the group so that other contenders lead",
				"since", since.Round(time.Millisecond))
			m.retire()
			m.close(e.leaveAgain)
			return
		}
	}
}

// stalled takes up, on the loop, a member its watchdog let go: what it led is lost (its Barrier
// runs now, late), and the next join waits for it to have left.
func (e *elector) stalled(m *member) {
	e.contender.RevokeAll()
	e.member, e.leaving = nil, m.closed
}

// leaveTries bounds how long a lost leave is asked again: a coordinator that loads the group
// drops an old membership by itself a session (2H) after it loads, and a crashed coordinator's
// successor loads within seconds of Kafka fencing the broker.
const leaveTries = time.Minute

// leaveAgain asks the group, in the background, to let memberID go, until it does, answers
// that it does not know the member, the contender closes, or leaveTries passes. A member let go
// after a fence or a stall leaves so that the others are given its partitions; when that leave
// is lost, as when the group's coordinator crashed and kgo gave up asking, the coordinator that
// takes over keeps the membership for a whole session, and the group's next rebalance, every
// partition of the election with it, waits that long for a member that will never join.
func (e *elector) leaveAgain(memberID string) {
	e.log.Info("the group may not have heard this contender's old membership leave; asking until it does", "memberID", memberID)
	go func() {
		deadline := time.Now().Add(leaveTries)
		for {
			err := e.leave(memberID)
			switch {
			case err == nil:
				e.log.Info("the group let the old membership go", "memberID", memberID)
				return
			case errors.Is(err, kerr.UnknownMemberID):
				return // gone already: left, or its session ran out
			case time.Now().After(deadline):
				e.log.Warn("the group did not let the old membership go; it leaves when its session runs out", "memberID", memberID, "error", err)
				return
			}
			select {
			case <-e.closing:
				return
			case <-time.After(DefaultElectionRetryBackoffMax):
			}
		}
	}()
}

// leave sends one LeaveGroup for memberID, through the heartbeat client (kgo finds the
// coordinator), and returns its error.
func (e *elector) leave(memberID string) error {
	req := kmsg.NewPtrLeaveGroupRequest()
	req.Group = e.cfg.LeaderGroupID
	req.MemberID = memberID // before v3
	m := kmsg.NewLeaveGroupRequestMember()
	m.MemberID = memberID
	req.Members = append(req.Members, m) // v3 and later
	ctx, cancel := context.WithTimeout(context.Background(), e.cfg.HeartbeatTimeout)
	defer cancel()
	resp, err := req.RequestWith(ctx, e.beats)
	if err != nil {
		return err
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return err
	}
	for _, m := range resp.Members {
		if err := kerr.ErrorForCode(m.ErrorCode); err != nil {
			return err
		}
	}
	return nil
}
