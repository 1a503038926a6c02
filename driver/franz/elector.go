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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/leadership"
	"github.com/goharvest/goharvest/internal/outage"
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
		cfg:            cfg,
		opts:           c.cfg.Opts,
		seeds:          c.cfg.SeedBrokers,
		log:            cfg.Logger.With("group", cfg.LeaderGroupID, "member", cfg.Name),
		heartbeatEvery: max(cfg.MinPollInterval, cfg.HeartbeatTimeout/10),
		kafkaTrouble:   &outage.Logger{What: "Kafka", Repeat: outage.LogInterval},
		view:           leadership.New(cfg.HeartbeatTimeout),
		wake:           make(chan struct{}, 1),
		closing:        make(chan struct{}),
	}
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
	cfg            driver.ElectorConfig
	opts           []kgo.Opt
	seeds          []string
	log            *slog.Logger
	heartbeatEvery time.Duration
	kafkaTrouble   *outage.Logger

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
	loop       sync.Mutex
	closed     bool
	topicReady bool
	member     *member       // in the group, or joining; nil otherwise
	leaving    chan struct{} // closed once a member let go after a fence has left the group
	// sizeUnknown is set when the leader topic's size could not be read after an assignment
	// (see checkSize); sizeCheckedAt is when it was last asked.
	sizeUnknown   bool
	sizeCheckedAt time.Time
	tenure        string // random, new when leadership begins; marks its heartbeats
	seq           uint64
	lastSent      time.Time
	fatal         error

	// view is what this contender leads, which Leading, Fenced and Partitions read.
	view *leadership.View
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

type beatResult struct {
	tenure    string
	sentAt    time.Time
	partition int32
	err       error
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
// leader broker is all the evidence a heartbeat gives (acks=1; see neli's sendHeartbeat for why
// not all in-sync replicas), and idempotence, which needs acks=all, has nothing to guard in
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
	if e.closed || e.fatal != nil || m == nil || e.leaving != nil || m.isRetired() || m.posting.Load() > 0 {
		return 0
	}
	rest := e.heartbeatEvery
	if holds, leading := e.view.Read(); holds {
		if !leading {
			return 0
		}
		rest = min(rest, time.Until(e.nextBeat()), time.Until(e.view.Lapses()))
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
func (e *elector) Leading() bool { return e.view.Leading() }

// Fenced reports whether partitions are still assigned but no heartbeat was acknowledged in time.
func (e *elector) Fenced() bool { return e.view.Fenced() }

// Partitions returns the partitions this contender leads now: none unless it is leading.
func (e *elector) Partitions() []int32 { return e.view.Partitions() }

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
	case e.fatal != nil:
		return false, e.fatal
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
	e.checkSize(ctx)
	e.readAcks()
	e.fenceIfSilent()
	if e.Leading() && !time.Now().Before(e.nextBeat()) {
		e.sendHeartbeats()
	}
	if e.fatal != nil {
		return false, e.fatal
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
		e.revoke(e.view.Held())
	}
	if !e.topicReady {
		err := e.prepareTopic(ctx)
		var fatal *fatalError
		if errors.As(err, &fatal) {
			return fatal.err
		}
		if err != nil {
			e.kafkaTrouble.Fail(e.log, "prepare the leader topic", err)
			return nil
		}
		e.topicReady = true
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
	e.revoke(e.view.Held())
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
		e.revoke(c.partitions)
	} else if e.sizeRead(c.inTopic) {
		e.acquire(c.partitions)
	}
	close(c.done)
}

func (e *elector) acquire(ps []int32) {
	if len(ps) == 0 {
		return
	}
	if last := ps[len(ps)-1]; int(last) >= e.cfg.Partitions {
		// As in neli: another contender created or grew the topic for more partitions.
		e.fatal = e.mismatch(int(last) + 1)
		return
	}
	beginning := e.view.Acquire(ps)
	if beginning {
		e.tenure = leadership.NewTenure()
		e.seq = 0
	}
	e.kafkaTrouble.OK(e.log)
	e.log.Info("acquired leadership", "partitions", leadership.List(ps))
	if beginning {
		e.sendHeartbeats()
	}
}

func (e *elector) revoke(ps []int32) {
	lost, wasFenced := e.view.Revoke(ps)
	if len(lost) == 0 {
		return
	}
	e.log.Info("leadership revoked", "partitions", leadership.List(lost))
	// A contender that fenced itself has run the Barrier already.
	if !wasFenced {
		e.barrier(lost)
	}
}

func (e *elector) barrier(ps []int32) {
	if e.cfg.Barrier != nil {
		e.cfg.Barrier(ps)
	}
}

// fenceIfSilent fences a leader whose heartbeats stopped being acknowledged, runs the Barrier, and
// lets its member go: the member leaves the group in the background, and a later Pulse joins
// with a new one once it has. An acknowledged heartbeat proves only that the contender reaches a
// broker, not that it is still a member, so leadership comes back only through a fresh
// assignment.
func (e *elector) fenceIfSilent() {
	led, silent := e.view.FenceIfSilent()
	if !silent {
		return
	}
	e.log.Warn("no heartbeat acknowledged within the timeout; stepping down and rejoining the group",
		"heartbeatTimeout", e.cfg.HeartbeatTimeout)
	e.barrier(led)
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
		e.fatal = e.permissionError("may not join the group", err, "READ on group "+e.cfg.LeaderGroupID)
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		e.fatal = e.permissionError("may not read the leader topic", err, "READ on topic "+e.cfg.LeaderTopic)
	case errors.Is(err, kerr.InvalidSessionTimeout):
		// The session is twice the heartbeat timeout (see NewElector), and the broker allows
		// only sessions within [group.min.session.timeout.ms, group.max.session.timeout.ms],
		// 6s to 30m by default: retrying cannot cure that.
		e.fatal = fmt.Errorf("franz: group %s: the broker refuses a session of %v, twice the heartbeat timeout %v (%w): "+
			"set the heartbeat timeout to half a session the broker allows (group.min.session.timeout.ms, 6s by default, needs 3s or more)",
			e.cfg.LeaderGroupID, 2*e.cfg.HeartbeatTimeout, e.cfg.HeartbeatTimeout, err)
	default:
		e.kafkaTrouble.Fail(e.log, "group", err)
	}
	return e.fatal
}

// partitionsInTopic asks how many partitions the leader topic has, for a member the group has
// just assigned: 0 if Kafka does not say within a quarter of the heartbeat timeout, since the
// rebalance waits for the answer (and Pulse, asking again; see checkSize).
//
// Every member is assigned at every rebalance (kgo calls OnPartitionsAssigned even with nothing
// new), and a contender configured for more partitions than the others grows the topic before
// it joins. Being assigned no partition at or above its own count does not show a member that
// the others agree with it: the balancer can give the new partitions to the one that grew them
// and leave the others what they had, and the two would then split the keys differently, the
// same key in two shards with two leaders. The topic's size shows it.
func (e *elector) partitionsInTopic(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.HeartbeatTimeout/4)
	defer cancel()
	t, err := e.topicMetadata(ctx)
	if err != nil || t.ErrorCode != 0 {
		return 0
	}
	return len(t.Partitions)
}

// checkSize asks again, once a heartbeat timeout, for the size of a leader topic that could not be
// read when the group last assigned this contender (see partitionsInTopic).
func (e *elector) checkSize(ctx context.Context) {
	if !e.sizeUnknown || time.Since(e.sizeCheckedAt) < e.cfg.HeartbeatTimeout {
		return
	}
	e.sizeRead(e.partitionsInTopic(ctx))
}

// sizeRead takes up an answer of partitionsInTopic (0 for none): it reports false, and stops the
// contender, when the topic has more partitions than it is configured for.
func (e *elector) sizeRead(inTopic int) bool {
	e.sizeCheckedAt, e.sizeUnknown = time.Now(), inTopic == 0
	if inTopic > e.cfg.Partitions {
		e.fatal = e.mismatch(inTopic)
		return false
	}
	return true
}

// mismatch is the error that stops a contender whose leader topic has grown to partitions, more
// than it is configured for.
func (e *elector) mismatch(partitions int) error {
	return fmt.Errorf("franz: leader topic %s has %d partitions or more, and this contender is configured for %d: "+
		"a member of group %s runs with a different number of partitions (shards); stop them all and "+
		"start them with one setting", e.cfg.LeaderTopic, partitions, e.cfg.Partitions, e.cfg.LeaderGroupID)
}

// nextBeat is when the heartbeat round after the last one is due: the first point after it was
// sent of the process's wake grid (package wakegrid), so that the rounds of many outboxes'
// leaders in one reaper, and the loops that send them, wake the process together. Rounds are
// never further apart than heartbeatEvery; the first after a leadership begins may come sooner.
func (e *elector) nextBeat() time.Time {
	if e.lastSent.IsZero() {
		return e.lastSent
	}
	return wakegrid.Next(e.lastSent, e.heartbeatEvery)
}

// sendHeartbeats sends a round of heartbeats, "name|tenure|seq", to up to
// leadership.HeartbeatFanout of the partitions this contender leads, taking them in turn (see
// neli's sendHeartbeat).
func (e *elector) sendHeartbeats() {
	beats := e.view.NextBeats()
	if len(beats) == 0 {
		return
	}
	now := time.Now()
	e.lastSent = now
	for _, partition := range beats {
		e.produceHeartbeat(partition, now)
	}
}

func (e *elector) produceHeartbeat(partition int32, sentAt time.Time) {
	e.seq++
	tenure := e.tenure
	r := &kgo.Record{
		Topic:     e.cfg.LeaderTopic,
		Partition: partition,
		Value:     []byte(e.cfg.Name + "|" + tenure + "|" + strconv.FormatUint(e.seq, 10)),
	}
	e.beats.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
		e.acksMu.Lock()
		e.acks = append(e.acks, beatResult{tenure: tenure, sentAt: sentAt, partition: partition, err: err})
		e.acksMu.Unlock()
		if err != nil {
			// An acknowledgement can wait for the next Pulse: it counts from when the heartbeat
			// was sent. A failure may call for a retry on partition 0, or stop the election.
			e.poke()
		}
	})
}

// readAcks counts the heartbeats acknowledged since the last Pulse. They are read here, on the
// loop, rather than as they come: a leader whose loop stalls must read as fenced once the timeout
// passes, so only the loop may vouch that it still runs.
func (e *elector) readAcks() {
	e.acksMu.Lock()
	acks := e.acks
	e.acks = nil
	e.acksMu.Unlock()
	for _, a := range acks {
		if a.tenure != e.tenure {
			continue // from an earlier tenure
		}
		if a.err != nil {
			e.heartbeatFailed(a)
			continue
		}
		// Once fenced, only a fresh assignment restores leadership (see fenceIfSilent).
		e.view.Acknowledged(a.sentAt)
		e.kafkaTrouble.OK(e.log)
	}
}

// heartbeatFailed handles a heartbeat that Kafka refused or that timed out.
func (e *elector) heartbeatFailed(a beatResult) {
	if errors.Is(a.err, kerr.TopicAuthorizationFailed) {
		// WRITE taken away while the election runs: Pulse returns it.
		e.fatal = e.permissionError("may not write heartbeats to the leader topic", a.err, "WRITE on topic "+e.cfg.LeaderTopic)
		return
	}
	var kafkaErr *kerr.Error
	if a.partition != 0 && !errors.As(a.err, &kafkaErr) && !errors.Is(a.err, kgo.ErrRecordTimeout) {
		// kgo refused the partition itself: the topic has grown and the client's metadata does
		// not show the new partitions yet (see heartbeatOpts), so it asks for them. Partition 0
		// always exists, and its acknowledgement shows the same. The original send time
		// stands: the acknowledgement still comes after it.
		e.beats.ForceMetadataRefresh()
		e.produceHeartbeat(0, a.sentAt)
		return
	}
	e.kafkaTrouble.Fail(e.log, "publish heartbeat", a.err)
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
	e.revoke(e.view.Held())
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
	if e.view.HeardWithin(pingHeard * e.heartbeatEvery) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.cfg.HeartbeatTimeout)
	defer cancel()
	if _, err := e.topicMetadata(ctx); err != nil {
		return fmt.Errorf("kafka metadata: %w", err)
	}
	return nil
}

type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

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
			return &fatalError{e.permissionError("may not describe the leader topic", err, "READ and WRITE on topic "+topic)}
		case err != nil:
			return fmt.Errorf("metadata of leader topic %s: %w", topic, err)
		case len(t.Partitions) > want:
			return &fatalError{fmt.Errorf("franz: leader topic %s has %d partitions, more than the %d configured: "+
				"Kafka cannot remove partitions, so use a new leader topic for fewer (see docs/operations.md, Scaling out)", topic, len(t.Partitions), want)}
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
// the group: without WRITE it cannot send heartbeats, without READ it cannot take up the
// partitions it is assigned, and either way it would be given partitions, lead each for a
// heartbeat timeout, fence itself and rejoin, for ever. A broker that does not say is not checked.
func (e *elector) checkPermissions(ops int32) error {
	if ops == math.MinInt32 {
		return nil
	}
	var missing []string
	for _, op := range []struct {
		bit  int32
		name string
	}{{aclRead, "READ"}, {aclWrite, "WRITE"}} {
		if ops&(1<<op.bit) == 0 {
			missing = append(missing, op.name)
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return &fatalError{e.permissionError("may not "+strings.ToLower(strings.Join(missing, " or "))+" the leader topic (to take up the partitions it is assigned and send heartbeats)",
		nil, strings.Join(missing, " and ")+" on topic "+e.cfg.LeaderTopic)}
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
		return &fatalError{fmt.Errorf("franz: leader topic %s needs %d partition(s) and this client may not create it "+
			"or add partitions (%v): create it with %d partition(s), or grant CREATE and ALTER on it", topic, want, err, want)}
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

// permissionError says what this contender may not do, and which ACL would allow it.
func (e *elector) permissionError(what string, cause error, grant string) error {
	if cause != nil {
		return fmt.Errorf("franz: group %s, leader topic %s: this client %s (%w): grant %s", e.cfg.LeaderGroupID, e.cfg.LeaderTopic, what, cause, grant)
	}
	return fmt.Errorf("franz: group %s, leader topic %s: this client %s: grant %s", e.cfg.LeaderGroupID, e.cfg.LeaderTopic, what, grant)
}

// electionMetadataMaxAge is how old a member's metadata may grow. What a member needs of it is
// the leader topic's partitions: as the group's leader it assigns from them, and kgo's leader
// rejoins when they grow. The topic grows only when a contender configured with more partitions
// joins, and the join's rebalance refreshes every member's metadata whose assignment it changes
// (see groupOpts), so the periodic refresh is a backstop. A refresh every heartbeat timeout
// cost an idle reaper of 50 outboxes about half a percent of a core.
const electionMetadataMaxAge = time.Minute
