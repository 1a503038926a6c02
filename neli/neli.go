package neli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/goharvest/goharvest/internal/dispatch"
	"github.com/goharvest/goharvest/internal/leadership"
	"github.com/goharvest/goharvest/internal/rdlog"
)

// State is a contender's view of its own leadership.
type State int

const (
	// Follower: no partition of the leader topic is assigned to this contender.
	Follower State = iota
	// Leader: at least one partition is assigned and a heartbeat of the contender's was acknowledged
	// within the heartbeat timeout. It leads the partitions that Partitions returns.
	Leader
	// Fenced: partitions may still be assigned, but no heartbeat was acknowledged in time, so the
	// contender must assume that others may be given them and act as a follower.
	Fenced
)

func (s State) String() string {
	switch s {
	case Follower:
		return "follower"
	case Leader:
		return "leader"
	case Fenced:
		return "fenced"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Event is a change of leadership, delivered to Config.OnEvent. Each names the partitions of
// the leader topic it concerns.
type Event interface {
	fmt.Stringer
	event()
}

// Acquired: this contender now leads these partitions (more may follow in later events).
type Acquired struct{ Partitions []int32 }

// SelfFenced: Kafka stopped acknowledging the contender's heartbeats and it stepped down from every
// partition it led; others may be given them at any moment. It rejoins the group and may be
// given partitions again.
type SelfFenced struct{ Partitions []int32 }

// Revoked: these partitions were taken from this contender (by a rebalance, or because it is
// closing). Follows Acquired, or SelfFenced if the contender had fenced itself.
type Revoked struct{ Partitions []int32 }

func (Acquired) event()   {}
func (SelfFenced) event() {}
func (Revoked) event()    {}

func (e Acquired) String() string { return "acquired partitions " + leadership.List(e.Partitions) }
func (e SelfFenced) String() string {
	return "fenced itself off partitions " + leadership.List(e.Partitions)
}
func (e Revoked) String() string { return "revoked partitions " + leadership.List(e.Partitions) }

// ErrClosed is returned by Pulse after Close.
var ErrClosed = errors.New("neli: closed")

// maxEventsPerPulse bounds the consumer events one Pulse handles, so that a flood of messages
// on the leader topic cannot starve the heartbeat check.
const maxEventsPerPulse = 100

// Neli is one contender for leadership of a group. Pulse (or Run, which calls it) and Close
// drive it from one goroutine at a time; IsLeader and State may be called from any goroutine.
type Neli struct {
	cfg      Config
	log      *slog.Logger
	consumer *kafka.Consumer // the group member: its assignment decides what this contender leads; the loop's (see replaceConsumer)
	instance string          // the consumer's group.instance.id (see Config.instanceID)
	retired  *atomic.Bool    // set when the consumer is replaced: its rebalance callbacks then do nothing
	producer *kafka.Producer // sends heartbeats; their delivery reports keep a leader unfenced (see sendHeartbeat)
	events   *dispatch.Dispatcher[Event]

	// loop serialises Pulse and Close; the fields below it belong to whoever holds it.
	loop         sync.Mutex
	closed       bool
	subscribed   bool
	fencedMember bool // librdkafka fenced the consumer's own static membership (see replaceConsumer)

	// contender is the election as no Kafka client decides it: what this contender leads (which
	// IsLeader, State and Partitions read), its heartbeats' books, and the error that stopped
	// it, found inside a rebalance callback or a delivery report and returned by Pulse.
	contender *leadership.Contender
}

// New validates the config and creates the Kafka clients. It does not contact Kafka: the first
// Pulse creates the leader topic if needed and joins the group.
func New(cfg Config) (*Neli, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("neli config: %w", err)
	}
	instance := cfg.instanceID()
	consumerConfig := cfg.consumerConfig(instance)
	consumer, err := kafka.NewConsumer(&consumerConfig)
	if err != nil {
		return nil, fmt.Errorf("neli: create consumer: %w", err)
	}
	producerConfig := cfg.producerConfig()
	producer, err := kafka.NewProducer(&producerConfig)
	if err != nil {
		consumer.Close()
		return nil, fmt.Errorf("neli: create heartbeat producer: %w", err)
	}
	n := &Neli{
		cfg:      cfg,
		log:      cfg.Logger.With("group", cfg.LeaderGroupID, "member", cfg.Name),
		consumer: consumer,
		instance: instance,
		retired:  new(atomic.Bool),
		producer: producer,
		events:   dispatch.New(cfg.OnEvent),
	}
	n.contender = leadership.NewContender(leadership.Config{
		Client:           "neli",
		LeaderTopic:      cfg.LeaderTopic,
		LeaderGroupID:    cfg.LeaderGroupID,
		Name:             cfg.Name,
		Partitions:       cfg.Partitions,
		HeartbeatTimeout: cfg.HeartbeatTimeout,
		MinPollInterval:  cfg.MinPollInterval,
		Send:             n.sendHeartbeat,
		Barrier:          cfg.Barrier,
		OnChange:         n.emit,
		Logger:           n.log,
	})
	rdlog.Forward(consumer.Logs(), n.log)
	rdlog.Forward(producer.Logs(), n.log)
	return n, nil
}

// IsLeader reports whether this contender is the leader now. It consults the clock, so a
// leader whose loop has stalled reads as fenced once the heartbeat timeout passes, even before
// the loop notices.
func (n *Neli) IsLeader() bool { return n.State() == Leader }

// State returns this contender's view of its leadership, consulting the clock as IsLeader does.
func (n *Neli) State() State {
	switch holds, leading := n.contender.Read(); {
	case !holds:
		return Follower
	case !leading:
		return Fenced
	}
	return Leader
}

// Partitions returns the partitions this contender leads now, in order: those assigned to it,
// while it is the Leader (see State); none otherwise.
func (n *Neli) Partitions() []int32 { return n.contender.Partitions() }

// Run pulses every MinPollInterval until ctx is done, then closes (allowing two heartbeat
// timeouts for that). It returns nil when ctx ends it, or the error that stopped it.
func (n *Neli) Run(ctx context.Context) error {
	ticker := time.NewTicker(n.cfg.MinPollInterval)
	defer ticker.Stop()
	closeNeli := func() error {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*n.cfg.HeartbeatTimeout)
		defer cancel()
		return n.Close(closeCtx)
	}
	for {
		if _, err := n.Pulse(ctx); err != nil {
			return errors.Join(err, closeNeli())
		}
		select {
		case <-ctx.Done():
			return closeNeli()
		case <-ticker.C:
		}
	}
}

// Pulse does one round of the election: it polls the consumer (waiting up to PollDuration),
// handles rebalances and heartbeats, fences a leader whose heartbeats stopped, and publishes a
// heartbeat if this contender leads. It must be called at least every MinPollInterval or so;
// Run does that. It returns whether this contender leads, and an error only for problems that
// retrying cannot fix (such as permission to create the leader topic); Kafka outages are
// logged and ridden out.
func (n *Neli) Pulse(ctx context.Context) (bool, error) {
	n.loop.Lock()
	defer n.loop.Unlock()
	if n.closed {
		return false, ErrClosed
	}
	if holds, _ := n.contender.Read(); !n.subscribed && !holds {
		if err := n.subscribe(ctx); err != nil {
			return false, err
		}
	}
	timeout := n.cfg.PollDuration
	for range maxEventsPerPulse {
		ev := n.consumer.Poll(int(timeout.Milliseconds()))
		if ev == nil {
			break
		}
		timeout = 0 // handle what is ready, but wait only once
		if err := n.handle(ev); err != nil {
			return false, err
		}
		if err := n.contender.Err(); err != nil {
			return false, err
		}
	}
	if n.fencedMember {
		if err := n.replaceConsumer(); err != nil {
			return false, err
		}
	}
	n.releaseIfLeft()
	return n.contender.EndPulse(n.partitionsInTopic, n.readDeliveries, n.leaveFenced)
}

// subscribe makes sure the leader topic is ready (see prepareTopic), then joins the group.
func (n *Neli) subscribe(ctx context.Context) error {
	if ready, err := n.contender.PrepareTopic(func() error { return n.prepareTopic(ctx) }); !ready {
		return err
	}
	retired := n.retired
	onRebalance := func(c *kafka.Consumer, ev kafka.Event) error {
		if retired.Load() {
			return nil // a replaced consumer's, closing off the loop (see replaceConsumer)
		}
		return n.onRebalance(c, ev)
	}
	if err := n.consumer.Subscribe(n.cfg.LeaderTopic, onRebalance); err != nil {
		return fmt.Errorf("neli: subscribe to %s: %w", n.cfg.LeaderTopic, err)
	}
	n.subscribed = true
	n.log.Info("joined the election", "topic", n.cfg.LeaderTopic)
	return nil
}

func (n *Neli) handle(ev kafka.Event) error {
	switch e := ev.(type) {
	case *kafka.Message:
		// Heartbeats, fetched from the partitions this contender leads: their delivery reports
		// have counted already (readDeliveries).
	case kafka.Error:
		if e.IsFatal() && e.Code() == kafka.ErrFencedInstanceID {
			n.fencedMember = true
			return nil
		}
		if e.IsFatal() {
			return fmt.Errorf("neli: fatal Kafka error: %w", e)
		}
		// Permissions taken away while the election runs (checkPermissions found them at the
		// start): retrying cannot help, and a contender that cannot join the group or fetch the
		// partitions it is assigned cannot lead.
		switch e.Code() {
		case kafka.ErrGroupAuthorizationFailed:
			return n.contender.Refused(leadership.JoinGroup, e)
		case kafka.ErrTopicAuthorizationFailed:
			return n.contender.Refused(leadership.ReadTopic, e)
		}
		if e.Code() == kafka.ErrUnknownTopicOrPart && n.contender.TopicReady() {
			// Just after the topic is created, metadata may not have caught up yet.
			n.log.Debug("leader topic not in metadata yet", "error", e)
			return nil
		}
		n.contender.KafkaFailed("poll", e)
	}
	return nil
}

// onRebalance runs inside Poll (or Close) when the group changes. The group uses the cooperative
// protocol: each event names only the partitions that change hands, and a partition that moves is
// revoked from its owner (whose barrier runs here) before the group assigns it to anyone else.
// librdkafka calls it at every rebalance, with nothing new assigned too, which is when the
// leader topic's size is checked (see leadership.Contender.SizeRead).
func (n *Neli) onRebalance(_ *kafka.Consumer, ev kafka.Event) error {
	switch e := ev.(type) {
	case kafka.AssignedPartitions:
		if n.contender.SizeRead(n.partitionsInTopic()); n.contender.Err() != nil {
			return nil
		}
		n.contender.Acquire(partitionsOf(e.Partitions))
	case kafka.RevokedPartitions:
		n.contender.Revoke(partitionsOf(e.Partitions))
	}
	return nil
}

// partitionsInTopic asks how many partitions the leader topic has: 0 if Kafka does not say within
// a quarter of the heartbeat timeout, since the loop waits for the answer. It asks through the
// heartbeat producer: the consumer's metadata requests, asked from inside or just after a
// rebalance, timed out again and again.
func (n *Neli) partitionsInTopic() int {
	topic := n.cfg.LeaderTopic
	md, err := n.producer.GetMetadata(&topic, false, int((n.cfg.HeartbeatTimeout / 4).Milliseconds()))
	if err != nil {
		return 0
	}
	t, ok := md.Topics[topic]
	if !ok || t.Error.Code() != kafka.ErrNoError {
		return 0
	}
	return len(t.Partitions)
}

func partitionsOf(tps []kafka.TopicPartition) []int32 {
	ps := make([]int32, 0, len(tps))
	for _, tp := range tps {
		ps = append(ps, tp.Partition)
	}
	slices.Sort(ps)
	return ps
}

// emit delivers a change of leadership to Config.OnEvent.
func (n *Neli) emit(ch leadership.Change, ps []int32) {
	switch ch {
	case leadership.Acquired:
		n.events.Emit(Acquired{Partitions: ps})
	case leadership.SelfFenced:
		n.events.Emit(SelfFenced{Partitions: ps})
	case leadership.Revoked:
		n.events.Emit(Revoked{Partitions: ps})
	}
}

// leaveFenced leaves the group after the contender fenced itself, to join it again: leadership
// comes back only through a fresh assignment (see leadership.Contender.EndPulse).
func (n *Neli) leaveFenced() {
	if err := n.consumer.Unsubscribe(); err != nil {
		n.log.Warn("leave group after fencing", "error", err)
	}
	n.subscribed = false // a later Pulse rejoins, once the revoke has been served (see releaseIfLeft)
}

// releaseIfLeft completes the departure of a contender that fenced itself: its partitions are
// let go once the consumer's assignment is empty. Usually the revoke callback, served by Poll, has
// done that already; the check covers a consumer that dropped its assignment without one.
// Rejoining waits for this: subscribing again while librdkafka still counts the partitions as
// owned would rejoin the cooperative group claiming them, and keep them from everyone.
func (n *Neli) releaseIfLeft() {
	if holds, _ := n.contender.Read(); n.subscribed || !holds {
		return
	}
	if parts, err := n.consumer.Assignment(); err == nil && len(parts) == 0 {
		n.contender.RevokeAll()
	}
}

// replaceConsumer replaces a consumer whose static membership librdkafka fenced: it joins again
// in the same membership's place. The identity is this contender's alone (Config.instanceID), so
// what fenced it was its own newer membership: after librdkafka drops its membership (its session
// ran out while the group's coordinator moved) it joins again under the same identity, and a
// request of the old membership still under way is then answered FENCED_INSTANCE_ID, which
// librdkafka takes for another process's and makes fatal (librdkafka issue 3437). Its partitions
// were revoked when the session ran out; any still held are revoked here (Revoked, Barrier)
// before the new consumer joins.
func (n *Neli) replaceConsumer() error {
	n.fencedMember = false
	n.contender.RevokeAll()
	n.log.Warn("librdkafka fenced the election consumer's own static membership; joining again in its place",
		"instance", n.instance)
	// The fenced consumer closes off the loop, its rebalance callbacks retired: librdkafka can
	// leave a fatal consumer unable to finish the rebalance it was in, and its Close then never
	// returns. A fatal consumer sends nothing more to the group.
	old := n.consumer
	n.retired.Store(true)
	n.retired = new(atomic.Bool)
	go old.Close()
	cm := n.cfg.consumerConfig(n.instance)
	consumer, err := kafka.NewConsumer(&cm)
	if err != nil {
		return fmt.Errorf("neli: create consumer: %w", err)
	}
	rdlog.Forward(consumer.Logs(), n.log)
	n.consumer, n.subscribed = consumer, false
	return nil
}

// leaveGrace is how long leave goes on serving the consumer once its assignment is released.
// librdkafka sends the LeaveGroup as soon as the released partitions' fetchers have stopped,
// within milliseconds, and says nothing when it has; should Close overtake it, the group holds the
// partitions for a session before it hands them over, which costs time but not safety.
const leaveGrace = 200 * time.Millisecond

// leave leaves the group before the consumer closes. The membership is static (see
// Config.instanceID), and librdkafka sends no LeaveGroup when a static member closes, only when it
// unsubscribes: without one the group would wait a whole session before handing this contender's
// partitions over. Unsubscribing revokes them first; Poll serves the revoke (Revoked, Barrier).
func (n *Neli) leave() {
	if !n.subscribed {
		return // it never joined, or it left when it fenced itself
	}
	if err := n.consumer.Unsubscribe(); err != nil {
		n.log.Warn("leave the group", "error", err)
		return
	}
	n.subscribed = false
	var released time.Time
	for deadline := time.Now().Add(n.cfg.HeartbeatTimeout); time.Now().Before(deadline); {
		if ev := n.consumer.Poll(10); ev != nil {
			_ = n.handle(ev) // closing: a problem now changes nothing
		}
		switch parts, err := n.consumer.Assignment(); {
		case err != nil:
			return
		case len(parts) > 0:
		case released.IsZero():
			released = time.Now()
		case time.Since(released) >= leaveGrace:
			return
		}
	}
}

// Close leaves the group promptly, so that other contenders are given its partitions at once. A
// leader is revoked first (Revoked, then Barrier). Events still queued are delivered before
// Close returns, unless ctx ends first; Close then returns ctx's error and the clients finish
// closing in the background.
func (n *Neli) Close(ctx context.Context) error {
	n.loop.Lock()
	if n.closed {
		n.loop.Unlock()
		return nil
	}
	n.closed = true
	done := make(chan error, 1)
	go func() {
		defer n.loop.Unlock()
		n.leave()
		err := n.consumer.Close()
		n.producer.Purge(kafka.PurgeQueue | kafka.PurgeInFlight | kafka.PurgeNonBlocking)
		n.producer.Close()
		n.events.Close()
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("neli: close: %w", err)
		}
	case <-ctx.Done():
		return fmt.Errorf("neli: close: %w", ctx.Err())
	}
	select {
	case <-n.events.Done():
		return nil
	case <-ctx.Done():
		return fmt.Errorf("neli: close: event handler still busy: %w", ctx.Err())
	}
}
