package neli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/goharvest/goharvest/internal/dispatch"
	"github.com/goharvest/goharvest/internal/outage"
	"github.com/goharvest/goharvest/internal/rdlog"
)

// State is a contender's view of its own leadership.
type State int

const (
	// Follower: partition 0 is not assigned to this contender.
	Follower State = iota
	// Leader: partition 0 is assigned and the contender's own heartbeat came back within the
	// heartbeat timeout.
	Leader
	// Fenced: partition 0 may still be assigned, but no heartbeat came back in time, so the
	// contender must assume another may be elected and act as a follower.
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

// Event is a change of leadership, delivered to Config.OnEvent.
type Event interface {
	fmt.Stringer
	event()
}

// LeaderAcquired: this contender became the leader.
type LeaderAcquired struct{}

// LeaderFenced: the leader stopped receiving its own heartbeats and stepped down; another
// contender may be elected at any moment. It will rejoin the group and may be elected again.
type LeaderFenced struct{}

// LeaderRevoked: partition 0 was taken from this contender (by a rebalance, or because it
// is closing). Follows LeaderAcquired, or LeaderFenced if the leader had fenced itself.
type LeaderRevoked struct{}

func (LeaderAcquired) event()         {}
func (LeaderFenced) event()           {}
func (LeaderRevoked) event()          {}
func (LeaderAcquired) String() string { return "leader acquired" }
func (LeaderFenced) String() string   { return "leader fenced" }
func (LeaderRevoked) String() string  { return "leader revoked" }

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
	consumer *kafka.Consumer
	producer *kafka.Producer
	events   *dispatch.Dispatcher[Event]

	// loop serialises Pulse and Close; the fields below it belong to whoever holds it.
	loop           sync.Mutex
	closed         bool
	subscribed     bool
	topicChecked   bool
	tenure         string               // random, new on each acquisition; marks our heartbeats
	seq            uint64               // heartbeat sequence within the tenure
	sent           map[uint64]time.Time // heartbeats not yet read back, by sequence
	lastSent       time.Time
	heartbeatEvery time.Duration
	kafkaTrouble   *outage.Logger

	// mu guards the leadership view read by IsLeader.
	mu            sync.Mutex
	assigned      bool
	fenced        bool
	lastHeartbeat time.Time // when the newest heartbeat read back was sent (monotonic)
}

// New validates the config and creates the Kafka clients. It does not contact Kafka: the first
// Pulse creates the leader topic if needed and joins the group.
func New(cfg Config) (*Neli, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("neli config: %w", err)
	}
	consumerConfig := cfg.consumerConfig()
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
		cfg:            cfg,
		log:            cfg.Logger.With("group", cfg.LeaderGroupID, "member", cfg.Name),
		consumer:       consumer,
		producer:       producer,
		events:         dispatch.New(cfg.OnEvent),
		heartbeatEvery: max(cfg.MinPollInterval, cfg.HeartbeatTimeout/10),
		kafkaTrouble:   &outage.Logger{What: "Kafka", Repeat: outage.LogInterval},
	}
	rdlog.Forward(consumer.Logs(), n.log)
	rdlog.Forward(producer.Logs(), n.log)
	// Heartbeats need no delivery reports; the channel carries only client errors, which are
	// drained so that it never fills.
	go func() {
		for ev := range producer.Events() {
			if kerr, ok := ev.(kafka.Error); ok {
				n.log.Debug("heartbeat producer error", "error", kerr)
			}
		}
	}()
	return n, nil
}

// IsLeader reports whether this contender is the leader now. It consults the clock, so a
// leader whose loop has stalled reads as fenced once the heartbeat timeout passes, even before
// the loop notices.
func (n *Neli) IsLeader() bool { return n.State() == Leader }

// State returns this contender's view of its leadership, consulting the clock as IsLeader does.
func (n *Neli) State() State {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case !n.assigned:
		return Follower
	case n.fenced || time.Since(n.lastHeartbeat) >= n.cfg.HeartbeatTimeout:
		return Fenced
	}
	return Leader
}

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
	if !n.subscribed {
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
	}
	n.fenceIfSilent()
	if n.State() == Leader && time.Since(n.lastSent) >= n.heartbeatEvery {
		n.sendHeartbeat()
	}
	return n.IsLeader(), nil
}

// subscribe makes sure the leader topic exists, then joins the group.
func (n *Neli) subscribe(ctx context.Context) error {
	if !n.topicChecked {
		err := n.ensureTopic(ctx)
		var fatal *fatalError
		if errors.As(err, &fatal) {
			return fatal.err
		}
		if err != nil {
			n.kafkaTrouble.Fail(n.log, "check the leader topic", err)
			return nil
		}
		n.topicChecked = true
	}
	if err := n.consumer.Subscribe(n.cfg.LeaderTopic, n.onRebalance); err != nil {
		return fmt.Errorf("neli: subscribe to %s: %w", n.cfg.LeaderTopic, err)
	}
	n.subscribed = true
	n.log.Info("joined the election", "topic", n.cfg.LeaderTopic)
	return nil
}

type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

// ensureTopic creates the leader topic with one partition unless it exists. A refusal for lack
// of permission is fatal, with advice; other failures (Kafka unreachable) are for retrying.
func (n *Neli) ensureTopic(ctx context.Context) error {
	admin, err := kafka.NewAdminClientFromConsumer(n.consumer)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	defer admin.Close()
	topic := n.cfg.LeaderTopic
	md, err := admin.GetMetadata(&topic, false, int(n.cfg.HeartbeatTimeout.Milliseconds()))
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	if t, ok := md.Topics[topic]; ok && t.Error.Code() == kafka.ErrNoError && len(t.Partitions) > 0 {
		return nil
	}
	createCtx, cancel := context.WithTimeout(ctx, n.cfg.HeartbeatTimeout)
	defer cancel()
	results, err := admin.CreateTopics(createCtx, []kafka.TopicSpecification{
		{Topic: topic, NumPartitions: 1, ReplicationFactor: -1},
	})
	if err != nil {
		return fmt.Errorf("create leader topic %s: %w", topic, err)
	}
	for _, r := range results {
		switch r.Error.Code() {
		case kafka.ErrNoError:
			n.log.Info("created the leader topic", "topic", topic)
		case kafka.ErrTopicAlreadyExists:
		case kafka.ErrTopicAuthorizationFailed, kafka.ErrClusterAuthorizationFailed:
			return &fatalError{fmt.Errorf("neli: leader topic %s does not exist and this client may not create it (%v): "+
				"create it with one partition, or grant CREATE on it", topic, r.Error)}
		default:
			return fmt.Errorf("create leader topic %s: %w", topic, r.Error)
		}
	}
	return nil
}

// Ping asks Kafka for the leader topic's metadata, to check that the cluster answers.
func (n *Neli) Ping(ctx context.Context) error {
	timeout := n.cfg.HeartbeatTimeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	topic := n.cfg.LeaderTopic
	if _, err := n.consumer.GetMetadata(&topic, false, max(1, int(timeout.Milliseconds()))); err != nil {
		return fmt.Errorf("kafka metadata: %w", err)
	}
	return nil
}

func (n *Neli) handle(ev kafka.Event) error {
	switch e := ev.(type) {
	case *kafka.Message:
		n.onHeartbeat(e)
	case kafka.Error:
		if e.IsFatal() {
			return fmt.Errorf("neli: fatal Kafka error: %w", e)
		}
		if e.Code() == kafka.ErrUnknownTopicOrPart && n.topicChecked {
			// Just after the topic is created, metadata may not have caught up yet.
			n.log.Debug("leader topic not in metadata yet", "error", e)
			return nil
		}
		n.kafkaTrouble.Fail(n.log, "poll", e)
	}
	return nil
}

// onRebalance runs inside Poll (or Close) when the group changes. Only partition 0 matters.
func (n *Neli) onRebalance(_ *kafka.Consumer, ev kafka.Event) error {
	switch e := ev.(type) {
	case kafka.AssignedPartitions:
		if hasPartitionZero(e.Partitions) {
			n.acquire()
		}
	case kafka.RevokedPartitions:
		n.mu.Lock()
		assigned := n.assigned
		n.mu.Unlock()
		if assigned && hasPartitionZero(e.Partitions) {
			n.revoke()
		}
	}
	return nil
}

func hasPartitionZero(parts []kafka.TopicPartition) bool {
	for _, p := range parts {
		if p.Partition == 0 {
			return true
		}
	}
	return false
}

func (n *Neli) acquire() {
	n.tenure = newTenure()
	n.seq = 0
	n.sent = map[uint64]time.Time{}
	n.mu.Lock()
	n.assigned, n.fenced = true, false
	// The coordinator has just vouched for us: our session outlives a heartbeat timeout from now.
	n.lastHeartbeat = time.Now()
	n.mu.Unlock()
	n.kafkaTrouble.OK(n.log)
	n.log.Info("acquired leadership")
	n.events.Emit(LeaderAcquired{})
	n.sendHeartbeat()
}

func (n *Neli) revoke() {
	n.mu.Lock()
	wasFenced := n.fenced
	n.assigned, n.fenced = false, false
	n.mu.Unlock()
	n.log.Info("leadership revoked")
	n.events.Emit(LeaderRevoked{})
	// A leader that fenced itself has run the barrier already.
	if !wasFenced {
		n.barrier()
	}
}

// fenceIfSilent fences a leader whose heartbeats have stopped coming back, then leaves and
// rejoins the group: reading its own heartbeats proves only that the leader reaches the
// partition, not that it is still a member, so leadership comes back only through a fresh
// assignment from the coordinator.
func (n *Neli) fenceIfSilent() {
	n.mu.Lock()
	silent := n.assigned && !n.fenced && time.Since(n.lastHeartbeat) >= n.cfg.HeartbeatTimeout
	if silent {
		n.fenced = true
	}
	n.mu.Unlock()
	if !silent {
		return
	}
	n.log.Warn("no heartbeat came back within the timeout; stepping down and rejoining the group",
		"heartbeatTimeout", n.cfg.HeartbeatTimeout)
	n.events.Emit(LeaderFenced{})
	n.barrier()
	if err := n.consumer.Unsubscribe(); err != nil {
		n.log.Warn("leave group after fencing", "error", err)
	}
	n.subscribed = false // the next Pulse rejoins, after this one has served the revoke
}

func (n *Neli) barrier() {
	if n.cfg.Barrier != nil {
		n.cfg.Barrier()
	}
}

// Heartbeats carry member name, tenure and sequence: "name|tenure|seq".
func (n *Neli) sendHeartbeat() {
	n.seq++
	now := time.Now()
	n.sent[n.seq] = now
	n.lastSent = now
	topic := n.cfg.LeaderTopic
	err := n.producer.Produce(&kafka.Message{
		TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: 0},
		Value:          []byte(n.cfg.Name + "|" + n.tenure + "|" + strconv.FormatUint(n.seq, 10)),
	}, nil)
	if err != nil {
		n.kafkaTrouble.Fail(n.log, "publish heartbeat", err)
	}
}

func (n *Neli) onHeartbeat(m *kafka.Message) {
	if m.TopicPartition.Partition != 0 {
		return
	}
	parts := strings.Split(string(m.Value), "|")
	if len(parts) != 3 || parts[0] != n.cfg.Name || parts[1] != n.tenure {
		return // another member's, or from an earlier tenure of ours
	}
	seq, err := strconv.ParseUint(parts[2], 10, 64)
	if err != nil {
		return
	}
	sentAt, ok := n.sent[seq]
	if !ok {
		return
	}
	for s := range n.sent {
		if s <= seq {
			delete(n.sent, s)
		}
	}
	n.mu.Lock()
	// Once fenced, only a fresh assignment restores leadership (see fenceIfSilent).
	if n.assigned && !n.fenced && sentAt.After(n.lastHeartbeat) {
		n.lastHeartbeat = sentAt
	}
	n.mu.Unlock()
	n.kafkaTrouble.OK(n.log)
}

func newTenure() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Close leaves the group promptly, so that another contender can be elected at once. A leader
// is revoked first (LeaderRevoked, then Barrier). Events still queued are delivered before
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
		// Closing the consumer runs the revoke callback and sends LeaveGroup.
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
