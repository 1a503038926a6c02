package driver

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/goharvest/goharvest/outbox"
)

// Message is what the harvester asks a KafkaProducer to publish.
type Message struct {
	Topic string
	Key   []byte
	// Value is nil for a message without a value (a tombstone); an empty, non-nil slice
	// publishes an empty value.
	Value   []byte
	Headers outbox.Headers
	// Opaque comes back, untouched, in the message's Delivery.
	Opaque any
}

// Delivery reports what became of one produced message.
type Delivery struct {
	Opaque any
	// Err is nil once every in-sync replica has the message. A *RejectedError means Kafka
	// refused this message as it stands (too large, topic missing or forbidden); any other error
	// is worth retrying as is (a timeout, a broker that went away).
	Err error
}

// RejectedError says that Kafka refused a message for a reason that retrying it right away
// will not cure, or that goharvest's own checks refused it before Kafka saw it (ByGoharvest).
// The harvester holds back that record's key, reports it, and retries it with backoff, in case
// the topic is created or the broker's limits raised, after reading its row afresh.
type RejectedError struct {
	Err error
	// ByGoharvest says the producer refused the message itself (a topic name Kafka cannot
	// accept, a topic Kafka's metadata says is missing), without sending it.
	ByGoharvest bool
	// Unauthorized says the refusal is of this client, not of the message: Kafka does not let it
	// write the topic (an ACL). Until that is granted the harvester can publish nothing of the
	// topic, so it is not ready (see Harvest.Ready).
	Unauthorized bool
}

func (e *RejectedError) Error() string {
	if e.ByGoharvest {
		return "refused by goharvest (not sent to Kafka): " + e.Err.Error()
	}
	return "rejected by Kafka: " + e.Err.Error()
}
func (e *RejectedError) Unwrap() error { return e.Err }

// KafkaProducer publishes messages asynchronously, in transactions. The harvester uses one
// producer per leader epoch and closes it before the next epoch starts. Every harvester of an
// outbox shares one transactional ID, so a new epoch's InitTransactions fences the producers of
// all earlier ones, in this process or another: whatever a deposed leader still sends (say, a
// process frozen and resumed) is rejected by the broker instead of landing after the new
// leader's records.
type KafkaProducer interface {
	// InitTransactions registers the transactional ID, fencing earlier producers with it.
	InitTransactions(ctx context.Context) error
	// BeginTransaction starts a transaction; produced messages belong to it until it ends.
	BeginTransaction() error
	// CommitTransaction flushes the transaction's messages and commits it. On error, see
	// TxnError for what may follow. A commit that ran out of time goes on, and the next call
	// resumes it; a driver may refuse a resume given too little time, with a retriable error,
	// rather than lose track of the commit (the librdkafka driver does).
	CommitTransaction(ctx context.Context) error
	// AbortTransaction aborts the current transaction; its messages are never committed.
	AbortTransaction(ctx context.Context) error
	// WriteNote attaches note to the current transaction: ReadNote returns it once the
	// transaction commits, and never if it aborts. The harvester notes which records a
	// transaction published, so that a successor can purge them instead of publishing them
	// again (see NotePlace).
	WriteNote(ctx context.Context, place NotePlace, note string) error
	// ReadNote returns the note of the latest committed transaction that wrote one at place, or
	// "" if none has. Called after InitTransactions, it sees the outcome of every earlier
	// producer's transaction.
	ReadNote(ctx context.Context, place NotePlace) (string, error)

	// Produce queues msg. Its outcome arrives later on Deliveries. An error means the message was
	// not queued and no Delivery will follow: a *RejectedError refuses the message as it stands;
	// a *TxnError with Fatal set means the producer is unusable; ErrQueueFull, ErrTopicPending and
	// any other *TxnError (a transaction being committed or aborted) mean try again shortly;
	// anything else is taken as a refusal of the message. Produce must not block: it is called
	// while the current transaction cannot end.
	Produce(msg Message) error
	// Deliveries reports every queued message exactly once, and is closed by Close.
	Deliveries() <-chan Delivery
	// Abandon gives up on every queued and in-flight message; each is then reported on
	// Deliveries with an error. Messages already on the wire may still reach the broker.
	Abandon()
	// Close releases the producer. The caller first waits for every Delivery (after Abandon if
	// need be); Close then closes Deliveries.
	Close()
}

// NotePlace is where transactions leave their notes: the committed offset metadata of partition
// Partition (the shard; 0 unless Config.Shards > 1) of Topic in the consumer group Group, a group
// without members that exists only for this.
// Committing offsets within a transaction is how Kafka makes a consumer's progress atomic with
// what it produces; goharvest uses the same mechanism to make "these records are published"
// atomic with publishing them.
type NotePlace struct {
	Group     string
	Topic     string
	Partition int32
}

// Kafka is a Kafka client as the engine needs it for one outbox: a transactional producer for
// each shard's epoch, and the leader election that decides who publishes each shard. Package
// driver/librdkafka is one. Neither method contacts a broker.
type Kafka interface {
	// NewProducer creates a producer. The harvester creates one per epoch and closes it before
	// the next.
	NewProducer(ProducerConfig) (KafkaProducer, error)
	// NewElector joins the leader election, from its first Pulse on.
	NewElector(ElectorConfig) (Elector, error)
}

// ProducerConfig is what the harvester decides about a producer; the client's own settings
// (brokers, security, batching) are its driver's.
type ProducerConfig struct {
	// TransactionalID is the shard's, which every harvester of the shard shares: the newest
	// producer to register it fences the others (see KafkaProducer).
	TransactionalID string
	// ClientID names the harvester to Kafka (goharvest.Config.Name), unless the driver's
	// settings name it otherwise.
	ClientID string
	// DeliveryTimeout is how long a message may take to be delivered (Limits.QueueTimeout),
	// unless the driver's settings say otherwise; a transaction must be allowed at least as long.
	DeliveryTimeout time.Duration
	// Logger takes the client's logs.
	Logger *slog.Logger
}

// ElectorConfig is what the harvester decides about the election: Fast NELI's terms (see package
// neli), whichever client implements it.
type ElectorConfig struct {
	// LeaderTopic's partitions are the shards: whoever the group assigns one leads that shard.
	LeaderTopic string
	// LeaderGroupID is the consumer group that every harvester of the outbox joins.
	LeaderGroupID string
	// Partitions is how many shards there are.
	Partitions int
	// Name identifies this harvester in the group and in logs.
	Name string
	// HeartbeatTimeout is how long a leader may go without hearing from Kafka before it fences
	// itself; the group's session must outlast it (neli derives it as twice this).
	HeartbeatTimeout time.Duration
	// PollDuration bounds one Pulse's wait; MinPollInterval is the time between pulses.
	PollDuration, MinPollInterval time.Duration
	// Barrier is called inside Pulse with the partitions this harvester stops leading (revoked,
	// or fenced), after Partitions has stopped returning them; the election hands them on only
	// once it returns.
	Barrier func(partitions []int32)
	// Logger takes the election's logs.
	Logger *slog.Logger
}

// Elector is leader election as the engine sees it (Fast NELI: package neli's, through
// driver/librdkafka).
type Elector interface {
	// Pulse polls the election; it returns an error only when the election cannot go on.
	Pulse(ctx context.Context) (bool, error)
	// Leading reports whether this harvester is elected now (neli.Leader).
	Leading() bool
	// Fenced reports whether this harvester fenced itself after losing touch with Kafka
	// (neli.Fenced).
	Fenced() bool
	// Partitions returns the partitions of the leader topic, which are the shards, that this
	// harvester leads now: none unless it is leading.
	Partitions() []int32
	Close(ctx context.Context) error
}

// RestingElector is an Elector that can say how long it may go without a Pulse. The owner loop
// pulses every MinPollInterval while anything is in motion; once every shard it leads has its
// epoch running and none is starting, it pulses only when Wake is signalled or Rest has passed.
// That is most of what an idle outbox costs the process, many outboxes in one reaper over.
type RestingElector interface {
	Elector
	// Wake is signalled when the election needs a Pulse at once: the group hands over or takes
	// back partitions, or a heartbeat failed.
	Wake() <-chan struct{}
	// Rest is how long, from now, the election can do without a Pulse: until its next heartbeat
	// is due or its leadership would lapse, and never more than a tenth of the heartbeat
	// timeout; 0 while it has no place in the group, or has a change of it waiting for a Pulse.
	// It is called on the goroutine that pulses.
	Rest() time.Duration
}

// ErrQueueFull is returned by Produce when the producer's queue has no room.
var ErrQueueFull = errors.New("producer queue full")

// TxnError classifies a failed transactional call. Retriable: call it again. Abortable: abort
// the transaction, then carry on with a new one. Fatal: the producer is unusable (fenced by a
// newer epoch, for one); end the epoch.
type TxnError struct {
	Err                         error
	Retriable, Abortable, Fatal bool
}

func (e *TxnError) Error() string { return e.Err.Error() }
func (e *TxnError) Unwrap() error { return e.Err }

// KafkaConfigError says that Kafka refused the producer's settings or permissions when it
// registered its transactional ID (a missing ACL: WRITE on the transactional ID; a
// transaction.timeout.ms above the broker's transaction.max.timeout.ms; a broker without
// transactions) or when it read its note (READ on the notes group). Retrying cannot cure it, so
// the harvester stops with it.
type KafkaConfigError struct{ Err error }

func (e *KafkaConfigError) Error() string { return e.Err.Error() }
func (e *KafkaConfigError) Unwrap() error { return e.Err }

// ErrTopicPending is returned by Produce while the producer finds out whether the message's
// topic exists; the caller tries again shortly.
var ErrTopicPending = errors.New("topic metadata lookup under way")
