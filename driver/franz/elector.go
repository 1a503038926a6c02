package franz

// The leader election, Fast NELI (see package neli's doc for the design and its arithmetic), on
// kgo's group client: whoever the consumer group assigns a partition of the leader topic leads
// that shard, for as long as the partition's leader broker keeps acknowledging its heartbeats.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/leadership"
	"github.com/goharvest/goharvest/internal/timing"
	"github.com/goharvest/goharvest/internal/wakegrid"
	"github.com/goharvest/goharvest/outbox"
)

var (
	_ driver.Kafka   = (*Client)(nil)
	_ driver.Elector = (*elector)(nil)
	_ driver.Pinger  = (*elector)(nil)

	_ driver.RestingElector = (*elector)(nil)
)

// NewElector joins the leader election on kgo's group client, from its first Pulse on. It
// contacts no broker.
//
// The election keeps package neli's terms: the group's session is twice the heartbeat timeout H,
// its heartbeat interval H/10, and a leader fences itself once no heartbeat of its own was
// acknowledged for H (see neli's doc, Safety), so that it has stopped before the coordinator can
// hand its partitions to anyone else. Partitions are spread with the cooperative-sticky balancer:
// a partition that moves is revoked from its owner, whose Barrier runs inside Pulse, before the
// group assigns it again.
//
// Membership is dynamic, unlike the librdkafka driver's static one. What static membership buys
// librdkafka is a rejoin in its own place after its session ran out while the group's
// coordinator moved; kgo counts no session of its own and keeps its member ID when a heartbeat
// fails, and Kafka's coordinator gives every member of a group it loads a full session, so the
// member rejoins in its own place either way. And a dynamic member leaves the group when it
// closes, which a static one does not. A crashed coordinator does cost a member its partitions
// (and so its leadership) when its heartbeat fails before the new coordinator serves: kgo
// retries a heartbeat for a session counted from when it was first sent, which Kafka's fencing
// of the crashed broker can outlast at the default timings, and it asks one broker where the
// coordinator is and after a failed connection one more, so a member that asks the crashed
// broker twice fails at once. Such a member asks to join again at most
// DefaultElectionRetryBackoffMax apart, since the group's rebalance waits for its slowest member.
// A leader that fenced itself leaves the group with a new member's join to follow; a leave lost
// to a crashed coordinator is asked again until the group hears it (leaveAgain), since the new
// coordinator would keep the old membership, and the rebalance with it, for a session
// (docs/operations.md, Cluster events, has the figures).
func (c *Client) NewElector(cfg driver.ElectorConfig) (driver.Elector, error) {
	if len(c.cfg.SeedBrokers) == 0 {
		return nil, errors.New("franz: Config.SeedBrokers is empty")
	}
	d := timing.Election{HeartbeatTimeout: cfg.HeartbeatTimeout, PollDuration: cfg.PollDuration, MinPollInterval: cfg.MinPollInterval}.WithDefaults()
	cfg.HeartbeatTimeout, cfg.PollDuration, cfg.MinPollInterval = d.HeartbeatTimeout, d.PollDuration, d.MinPollInterval
	cfg.Partitions = max(cfg.Partitions, 1)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var errs []error
	for _, p := range d.Problems() {
		errs = append(errs, fmt.Errorf("%s %v: %s", p.Field, p.Value, p.Reason))
	}
	if err := outbox.CheckName(cfg.LeaderTopic); err != nil {
		errs = append(errs, fmt.Errorf("LeaderTopic %q: %w", cfg.LeaderTopic, err))
	}
	if err := outbox.CheckName(cfg.LeaderGroupID); err != nil {
		errs = append(errs, fmt.Errorf("LeaderGroupID %q: %w", cfg.LeaderGroupID, err))
	}
	if strings.TrimSpace(cfg.Name) == "" {
		errs = append(errs, errors.New("Name: required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("franz: election config: %w", err)
	}
	e := &elector{
		cfg:     cfg,
		opts:    c.cfg.Opts,
		seeds:   c.cfg.SeedBrokers,
		log:     cfg.Logger.With("group", cfg.LeaderGroupID, "member", cfg.Name),
		wake:    make(chan struct{}, 1),
		closing: make(chan struct{}),
	}
	e.contender = leadership.NewContender(leadership.Config{
		Client:           "franz",
		LeaderTopic:      cfg.LeaderTopic,
		LeaderGroupID:    cfg.LeaderGroupID,
		Name:             cfg.Name,
		Partitions:       cfg.Partitions,
		HeartbeatTimeout: cfg.HeartbeatTimeout,
		MinPollInterval:  cfg.MinPollInterval,
		// The rounds of many outboxes' leaders in one reaper, and the loops that send them,
		// wake the process together.
		OnWakeGrid: true,
		Send:       e.produceHeartbeat,
		Barrier:    cfg.Barrier,
		Logger:     e.log,
	})
	beats, err := kgo.NewClient(e.heartbeatOpts()...)
	if err != nil {
		return nil, fmt.Errorf("franz: create heartbeat client: %w", err)
	}
	e.beats = beats
	return e, nil
}

// elector is one contender. Pulse and Close drive it from one goroutine at a time; Leading,
// Fenced, Partitions and Ping may be called from any.
type elector struct {
	cfg   driver.ElectorConfig
	opts  []kgo.Opt
	seeds []string
	log   *slog.Logger

	// beats sends heartbeats and the election's own requests (the leader topic's metadata and
	// creation, Ping). It lives as long as the contender; members come and go.
	beats *kgo.Client
	// acks are the heartbeats' outcomes, posted by kgo's promises and read by Pulse: only the
	// loop may vouch that the contender still runs (see readAcks).
	acksMu sync.Mutex
	acks   []beatResult
	// lastPulse is when Pulse last began (UnixNano); a member's watchdog reads it.
	lastPulse atomic.Int64
	// closing is closed when Close begins: it ends the redelivery of a lost leave (leaveAgain).
	closing chan struct{}
	// wake is signalled (without blocking) when the loop should pulse at once: a rebalance
	// callback waits for it, a heartbeat failed, or group management reported an error.
	wake chan struct{}
	// groupErr is the newest error of a member's group management, posted by kgo's hook.
	groupErr struct {
		sync.Mutex
		err error
	}

	// loop serialises Pulse and Close; the fields below belong to whoever holds it.
	loop    sync.Mutex
	closed  bool
	member  *member       // in the group, or joining; nil otherwise
	leaving chan struct{} // closed once a member let go after a fence has left the group

	// contender is the election as no Kafka client decides it: what this contender leads (which
	// Leading, Fenced and Partitions read), its heartbeats' books, and the error that stopped it.
	contender *leadership.Contender
}

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

// beatResult is a heartbeat's outcome, as kgo's promise posts it for the loop.
type beatResult struct {
	beat leadership.Beat
	err  error
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

// heartbeatOpts configures the heartbeat client. A heartbeat older than the timeout proves
// nothing, so it is given up rather than delivered late; the acknowledgement of the partition's
// leader broker is all the evidence a heartbeat gives (acks=1; see
// leadership.Contender.SendHeartbeats for why not all in-sync replicas), and idempotence, which needs acks=all, has nothing to guard in
// heartbeats. Its metadata keeps kgo's age (5 minutes): kgo refreshes it when a partition's
// leader moves or its broker goes, and a heartbeat to a partition the client does not know yet
// asks for it (see heartbeatFailed). A refresh every heartbeat timeout cost an idle reaper of 50
// outboxes about half a percent of a core.
func (e *elector) heartbeatOpts() []kgo.Opt {
	opts := append([]kgo.Opt{kgo.ClientID(e.cfg.Name + ".heartbeat"), kgo.RetryBackoffFn(backoff(DefaultRetryBackoff, DefaultElectionRetryBackoffMax))}, e.opts...)
	return append(opts,
		kgo.SeedBrokers(e.seeds...),
		kgo.RequiredAcks(kgo.LeaderAck()),
		kgo.DisableIdempotentWrite(),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(e.cfg.HeartbeatTimeout),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.MetadataMinAge(100*time.Millisecond),
		kgo.WithLogger(slogLogger{e.log}),
	)
}

// groupErrorHook takes a member's group management errors, which kgo otherwise only logs.
type groupErrorHook struct{ e *elector }

func (h groupErrorHook) OnGroupManageError(err error) {
	h.e.groupErr.Lock()
	h.e.groupErr.err = err
	h.e.groupErr.Unlock()
	h.e.poke()
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

// poke signals wake, without waiting: one pending signal serves any number of reasons.
func (e *elector) poke() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// Wake is signalled when the election needs a Pulse at once (see driver.RestingElector).
func (e *elector) Wake() <-chan struct{} { return e.wake }

// Rest is how long the election can do without a Pulse (see driver.RestingElector): a member
// that leads needs one when its next heartbeat is due, or before its leadership lapses should
// no acknowledgement come; one that leads nothing only serves the group's callbacks, which
// signal Wake. A contender with no member in the group (or one let go), one with a callback
// waiting, a fenced one and one stopped on an error have none.
func (e *elector) Rest() time.Duration {
	e.loop.Lock()
	defer e.loop.Unlock()
	m := e.member
	if e.closed || e.contender.Err() != nil || m == nil || e.leaving != nil || m.isRetired() || m.posting.Load() > 0 {
		return 0
	}
	rest := e.contender.HeartbeatEvery()
	if holds, leading := e.contender.Read(); holds {
		if !leading {
			return 0
		}
		rest = min(rest, time.Until(e.contender.NextBeat()), time.Until(e.contender.Lapses()))
	}
	return max(rest, 0)
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

// Leading reports whether this contender leads now. It consults the clock, so a leader whose loop
// stalled reads as fenced once the heartbeat timeout passes, before the loop notices.
func (e *elector) Leading() bool { return e.contender.Leading() }

// Fenced reports whether partitions are still assigned but no heartbeat was acknowledged in time.
func (e *elector) Fenced() bool { return e.contender.Fenced() }

// Partitions returns the partitions this contender leads now: none unless it is leading.
func (e *elector) Partitions() []int32 { return e.contender.Partitions() }

// maxChangesPerPulse bounds the rebalance callbacks one Pulse serves.
const maxChangesPerPulse = 100

// Pulse does one round of the election: it joins the group if this contender is out of it,
// applies the group's changes (waiting up to PollDuration for one a callback is handing over), counts acknowledged
// heartbeats, fences a leader whose heartbeats stopped, and sends heartbeats. Kafka outages are
// logged and ridden out; the error is for what retrying cannot fix.
func (e *elector) Pulse(ctx context.Context) (bool, error) {
	e.loop.Lock()
	defer e.loop.Unlock()
	e.lastPulse.Store(time.Now().UnixNano())
	switch {
	case e.closed:
		return false, errors.New("franz: election closed")
	case e.contender.Err() != nil:
		return false, e.contender.Err()
	}
	if m := e.member; m != nil && m.isRetired() {
		e.stalled(m)
	}
	if e.member == nil {
		if err := e.join(ctx); err != nil {
			return false, err
		}
	}
	if e.member != nil {
		e.serve(e.member, e.cfg.PollDuration)
		if err := e.checkGroupError(); err != nil {
			return false, err
		}
	}
	if e.contender.SizeDue() {
		e.contender.SizeRead(e.partitionsInTopic(ctx))
	}
	e.readAcks()
	e.fenceIfSilent()
	e.contender.BeatIfDue()
	if err := e.contender.Err(); err != nil {
		return false, err
	}
	return e.Leading(), nil
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

// serve applies the changes m's callbacks hand over: while a callback is posting one it waits up
// to wait for the first, then takes what is ready. With none posting it sets no timer: a
// callback that posts later wakes the loop (see post), and a resting leader's Pulse stays one
// wake of the process rather than two.
func (e *elector) serve(m *member, wait time.Duration) {
	served := 0
	if m.posting.Load() > 0 {
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case c := <-m.changes:
			e.apply(c)
			served++
		case <-timer.C:
			return
		}
	}
	for ; served < maxChangesPerPulse; served++ {
		select {
		case c := <-m.changes:
			e.apply(c)
		default:
			return
		}
	}
}

// apply applies one change, then lets its callback return.
func (e *elector) apply(c change) {
	if !c.assigned {
		e.contender.Revoke(c.partitions)
	} else if e.contender.SizeRead(c.inTopic) {
		e.contender.Acquire(c.partitions)
	}
	close(c.done)
}

// fenceIfSilent fences a leader whose heartbeats stopped being acknowledged (see
// leadership.Contender.FenceIfSilent) and lets its member go: the member leaves the group in the
// background, and a later Pulse joins with a new one once it has.
func (e *elector) fenceIfSilent() {
	if !e.contender.FenceIfSilent() {
		return
	}
	if m := e.member; m != nil {
		m.retire()
		m.close(e.leaveAgain)
		e.member, e.leaving = nil, m.closed
	}
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
		e.contender.Stop(e.contender.PermissionError("may not join the group", err, "READ on group "+e.cfg.LeaderGroupID))
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		e.contender.Stop(e.contender.PermissionError("may not read the leader topic", err, "READ on topic "+e.cfg.LeaderTopic))
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

// partitionsInTopic asks how many partitions the leader topic has, for a member the group has
// just assigned (kgo calls OnPartitionsAssigned at every rebalance, with nothing new too; see
// leadership.Contender.SizeRead): 0 if Kafka does not say within a quarter of the heartbeat
// timeout, since the rebalance waits for the answer (and Pulse, asking again).
func (e *elector) partitionsInTopic(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.HeartbeatTimeout/4)
	defer cancel()
	t, err := e.topicMetadata(ctx)
	if err != nil || t.ErrorCode != 0 {
		return 0
	}
	return len(t.Partitions)
}

// produceHeartbeat hands one heartbeat of the contender's to the heartbeat client; its outcome
// waits for the loop (see readAcks).
func (e *elector) produceHeartbeat(b leadership.Beat) {
	r := &kgo.Record{Topic: e.cfg.LeaderTopic, Partition: b.Partition, Value: b.Value}
	e.beats.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
		e.acksMu.Lock()
		e.acks = append(e.acks, beatResult{beat: b, err: err})
		e.acksMu.Unlock()
		if err != nil {
			// An acknowledgement can wait for the next Pulse: it counts from when the heartbeat
			// was sent. A failure may call for a retry on partition 0, or stop the election.
			e.poke()
		}
	})
}

// readAcks hands the contender the heartbeats' outcomes posted since the last Pulse. They are
// read here, on the loop, rather than as they come: a leader whose loop stalls must read as
// fenced once the timeout passes, so only the loop may vouch that it still runs.
func (e *elector) readAcks() {
	e.acksMu.Lock()
	acks := e.acks
	e.acks = nil
	e.acksMu.Unlock()
	for _, a := range acks {
		if err := e.contender.Delivered(a.beat, a.err); err != nil {
			e.heartbeatFailed(a.beat, err)
		}
	}
}

// heartbeatFailed handles a heartbeat that Kafka refused or that timed out. WRITE taken away
// while the election runs stops it: Pulse returns the error.
func (e *elector) heartbeatFailed(b leadership.Beat, err error) {
	var kafkaErr *kerr.Error
	if b.Partition != 0 && !errors.As(err, &kafkaErr) && !errors.Is(err, kgo.ErrRecordTimeout) {
		// kgo refused the partition itself: the topic has grown and the client's metadata does
		// not show the new partitions yet (see heartbeatOpts), so it asks for them. Partition 0
		// always exists, and its acknowledgement shows the same. The original send time
		// stands: the acknowledgement still comes after it.
		e.beats.ForceMetadataRefresh()
		e.produceHeartbeat(e.contender.Beat(0, b.SentAt))
		return
	}
	e.contender.HeartbeatFailed(err, errors.Is(err, kerr.TopicAuthorizationFailed))
}

// Close leaves the group, so that the other contenders are given this one's partitions at once;
// a leader is revoked first, and its Barrier runs here. If ctx ends first, Close returns its
// error and the clients finish closing in the background.
func (e *elector) Close(ctx context.Context) error {
	e.loop.Lock()
	defer e.loop.Unlock()
	if e.closed {
		return nil
	}
	e.closed = true
	close(e.closing)
	var err error
	if m := e.member; m != nil {
		e.member = nil
		m.close(func(string) {})
	serving:
		for {
			select {
			case c := <-m.changes:
				e.apply(c)
			case <-m.closed:
				break serving
			case <-ctx.Done():
				m.retire()
				err = fmt.Errorf("franz: close the election: %w", ctx.Err())
				break serving
			}
		}
	}
	if e.leaving != nil {
		// A member let go after a fence is still leaving the group.
		select {
		case <-e.leaving:
		case <-ctx.Done():
			err = fmt.Errorf("franz: close the election: %w", ctx.Err())
		}
	}
	// Whatever is still held (after a fence, or a Close cut short) is let go.
	e.contender.RevokeAll()
	beatsClosed := make(chan struct{})
	go func() {
		defer close(beatsClosed)
		e.beats.Close() // fails the heartbeats in flight
	}()
	select {
	case <-beatsClosed:
	case <-ctx.Done():
		if err == nil {
			err = fmt.Errorf("franz: close the election: %w", ctx.Err())
		}
	}
	return err
}

// pingHeard is how many heartbeat intervals old a leader's newest acknowledged heartbeat may be for
// Ping to take it as the cluster's answer: the loop reads acknowledgements at least once an
// interval, even at rest, so a leader in touch with Kafka always has one that recent.
const pingHeard = 3

// Ping checks that the cluster answers. A leader whose heartbeats a broker acknowledged within the
// last pingHeard heartbeat intervals knows already; anyone else asks for the leader topic's
// metadata. Readiness asks every few seconds per outbox, and a leader's answer costs Kafka no
// request.
func (e *elector) Ping(ctx context.Context) error {
	if e.contender.HeardWithin(pingHeard * e.contender.HeartbeatEvery()) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.HeartbeatTimeout)
	defer cancel()
	if _, err := e.topicMetadata(ctx); err != nil {
		return fmt.Errorf("kafka metadata: %w", err)
	}
	return nil
}

// topicMetadata returns the leader topic's metadata, with the operations this client may perform
// on it (KIP-430). It never creates the topic.
func (e *elector) topicMetadata(ctx context.Context) (*kmsg.MetadataResponseTopic, error) {
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(e.cfg.LeaderTopic)
	req.Topics = append(req.Topics, t)
	req.AllowAutoTopicCreation = false
	req.IncludeTopicAuthorizedOperations = true
	resp, err := request(ctx, e.beats, req)
	if err != nil {
		return nil, err
	}
	if len(resp.Topics) != 1 {
		return nil, fmt.Errorf("metadata of %s: %d topics in the answer", e.cfg.LeaderTopic, len(resp.Topics))
	}
	return &resp.Topics[0], nil
}

// prepareTopic creates the leader topic with Partitions partitions unless it exists, adds
// partitions to one that has fewer (Kafka cannot take them away, so more is an error), checks
// this contender may read and write it, and returns nil once the metadata shows every partition
// with a leader: a member whose metadata lacks the topic would, as the group's leader, assign no
// partition of it. A refusal for lack of permission is fatal, with advice; anything else that
// outlasts a heartbeat timeout is for the next Pulse to retry.
func (e *elector) prepareTopic(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.HeartbeatTimeout)
	defer cancel()
	topic, want := e.cfg.LeaderTopic, e.cfg.Partitions
	for {
		t, err := e.topicMetadata(ctx)
		if err != nil {
			return fmt.Errorf("metadata: %w", err)
		}
		pending := ""
		switch err := kerr.ErrorForCode(t.ErrorCode); {
		case errors.Is(err, kerr.UnknownTopicOrPartition):
			if err := e.createTopic(ctx); err != nil {
				return err
			}
			pending = "the topic created"
		case errors.Is(err, kerr.TopicAuthorizationFailed):
			return &leadership.Permanent{Err: e.contender.PermissionError("may not describe the leader topic", err, "READ and WRITE on topic "+topic)}
		case err != nil:
			return fmt.Errorf("metadata of leader topic %s: %w", topic, err)
		case len(t.Partitions) > want:
			return e.contender.TopicTooLarge(len(t.Partitions))
		case len(t.Partitions) < want:
			if err := e.addPartitions(ctx); err != nil {
				return err
			}
			pending = "the partitions added"
		}
		for _, p := range t.Partitions {
			if pending == "" && (p.Leader < 0 || p.ErrorCode != 0) {
				pending = fmt.Sprintf("partition %d's leader (%v)", p.Partition, kerr.ErrorForCode(p.ErrorCode))
			}
		}
		if pending == "" {
			return e.checkPermissions(t.AuthorizedOperations)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("leader topic %s: the metadata does not show %s yet", topic, pending)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Kafka's ACL operation codes, as KIP-430's bit field numbers them.
const (
	aclRead  = 3
	aclWrite = 4
)

// checkPermissions makes sure this contender may read and write the leader topic before it joins
// the group (see leadership.Contender.MissingPermissions); ops is KIP-430's bit field. A broker
// that does not say is not checked.
func (e *elector) checkPermissions(ops int32) error {
	if ops == math.MinInt32 {
		return nil
	}
	return e.contender.MissingPermissions(ops&(1<<aclRead) != 0, ops&(1<<aclWrite) != 0)
}

// createTopic creates the leader topic; it may take a moment to show in the metadata.
func (e *elector) createTopic(ctx context.Context) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic, t.NumPartitions, t.ReplicationFactor = e.cfg.LeaderTopic, int32(e.cfg.Partitions), -1
	req.Topics = append(req.Topics, t)
	req.TimeoutMillis = int32(e.cfg.HeartbeatTimeout.Milliseconds())
	resp, err := request(ctx, e.beats, req)
	if err == nil && len(resp.Topics) == 1 {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	return e.topicChanged("create", err)
}

// addPartitions grows the leader topic to Partitions partitions.
func (e *elector) addPartitions(ctx context.Context) error {
	req := kmsg.NewPtrCreatePartitionsRequest()
	t := kmsg.NewCreatePartitionsRequestTopic()
	t.Topic, t.Count = e.cfg.LeaderTopic, int32(e.cfg.Partitions)
	req.Topics = append(req.Topics, t)
	req.TimeoutMillis = int32(e.cfg.HeartbeatTimeout.Milliseconds())
	resp, err := request(ctx, e.beats, req)
	if err == nil && len(resp.Topics) == 1 {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	return e.topicChanged("add partitions to", err)
}

// topicChanged classifies the outcome of creating or growing the leader topic.
func (e *elector) topicChanged(what string, err error) error {
	topic, want := e.cfg.LeaderTopic, e.cfg.Partitions
	switch {
	case err == nil:
		e.log.Info("leader topic ready", "topic", topic, "partitions", want)
	case errors.Is(err, kerr.TopicAlreadyExists):
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return e.contender.MayNotCreateTopic(err)
	default:
		return fmt.Errorf("%s leader topic %s: %w", what, topic, err)
	}
	return nil
}

// request issues req and returns by ctx's end at the latest: kgo honours ctx while it waits for an
// answer, but not while it connects to a broker (up to its dial timeout, 10s by default), and the
// election must not wait that long inside Pulse. The request goes on in the background then.
func request[Resp kmsg.Response](ctx context.Context, cl *kgo.Client, req interface {
	kmsg.Request
	RequestWith(context.Context, kmsg.Requestor) (Resp, error)
}) (Resp, error) {
	type answer struct {
		resp Resp
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := req.RequestWith(ctx, cl)
		done <- answer{resp, err}
	}()
	select {
	case a := <-done:
		return a.resp, a.err
	case <-ctx.Done():
		var zero Resp
		return zero, ctx.Err()
	}
}

// electionMetadataMaxAge is how old a member's metadata may grow. What a member needs of it is
// the leader topic's partitions: as the group's leader it assigns from them, and kgo's leader
// rejoins when they grow. The topic grows only when a contender configured with more partitions
// joins, and the join's rebalance refreshes every member's metadata whose assignment it changes
// (see groupOpts), so the periodic refresh is a backstop. A refresh every heartbeat timeout
// cost an idle reaper of 50 outboxes about half a percent of a core.
const electionMetadataMaxAge = time.Minute
