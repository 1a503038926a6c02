package franz

// The leader election, Fast NELI (see package neli's doc for the design and its arithmetic), on
// kgo's group client: whoever the consumer group assigns a partition of the leader topic leads
// that shard, for as long as the partition's leader broker keeps acknowledging its heartbeats.
// What no Kafka client decides is leadership.Contender's; this file is the elector's loop, and
// the client's part is split by concern: the group membership (elector_member.go), the leader's
// heartbeats (elector_heartbeat.go) and the leader topic's administration (elector_topic.go).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/leadership"
	"github.com/goharvest/goharvest/internal/timing"
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
	if err := errors.Join(leadership.Problems(cfg.LeaderTopic, cfg.LeaderGroupID, cfg.Name, d)...); err != nil {
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
	size := func() int { return e.partitionsInTopic(ctx) }
	return e.contender.EndPulse(size, e.readAcks, e.leaveFenced)
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

// leaveFenced lets the member go after the contender fenced itself (see
// leadership.Contender.EndPulse): the member leaves the group in the background, and a later
// Pulse joins with a new one once it has.
func (e *elector) leaveFenced() {
	if m := e.member; m != nil {
		m.retire()
		m.close(e.leaveAgain)
		e.member, e.leaving = nil, m.closed
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
