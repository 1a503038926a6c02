// Package franz is a Kafka client for goharvest on franz-go (package kgo), in pure Go: no cgo,
// no librdkafka. Its producers implement driver.KafkaProducer and keep the same contract as those
// of package driver/librdkafka (drivertest.RunProducer): transactions, fencing by transactional
// ID, notes in the transaction's committed offsets, and keys (the empty key included)
// partitioned as the Java client and the librdkafka driver partition them. Either driver reads
// the other's notes and fences the other's producers.
//
//	client := franz.New(franz.Config{SeedBrokers: []string{"localhost:9092"}})
//	p, err := client.NewProducer(driver.ProducerConfig{TransactionalID: "orders-0", ...})
//
// goharvest.Config chooses it with KafkaClient "franz" (the reaper's harvest.kafkaClient), and
// makes its Config from the librdkafka properties of BaseKafkaConfig and ProducerKafkaConfig
// with FromProperties, which refuses what it cannot honour. Its leader election (NewElector) is
// Fast NELI, as package neli's, on kgo's group client.
//
// It runs either of Kafka's transaction protocols, as the cluster's transaction.version feature
// says when InitTransactions asks. At 2 or more (KIP-890 part 2: the default of clusters created
// by Kafka 4.0 and later) a produce adds its partition to the transaction, and a note is written
// with TxnOffsetCommit v5 or later, which adds the notes group to the transaction itself. Below 2
// (Kafka 3.x, or a cluster upgraded to 4.x without raising it) kgo adds partitions with
// AddPartitionsToTxn, and a note is written as librdkafka writes it: AddOffsetsToTxn for its
// group once per transaction, then TxnOffsetCommit v4, on a second kgo client of the producer's
// that holds TxnOffsetCommit to v4 (see producer.notes).
package franz

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/goharvest/goharvest/driver"
)

// Defaults the client gives its producers where Config sets none.
const (
	// DefaultLinger is kgo.ProducerLinger; kgo's own default is 10ms. The transaction loop already
	// gathers records between commits, and a commit flushes what is queued at once; a longer wait
	// would only delay each delivery report, and with it the commit that releases a key's next
	// record. (The librdkafka driver's DefaultLinger is the same.)
	DefaultLinger = time.Millisecond
	// DefaultTransactionTimeout is kgo.TransactionTimeout, raised to the delivery timeout when
	// that is longer, since a transaction must be allowed as long as its messages; kgo's own
	// default is 40s. The same as the librdkafka driver's.
	DefaultTransactionTimeout = time.Minute
	// DefaultRetryBackoff and DefaultRetryBackoffMax bound the clients' wait before they try a
	// failed request again (kgo.RetryBackoffFn): the first wait, doubled after each further
	// failure up to the most, with a fifth either way of jitter. kgo's own starts at 250ms and
	// doubles up to 5s. kgo has one backoff, which is also when it connects again to a broker it
	// lost and asks again for the metadata: librdkafka's retry.backoff.ms, retry.backoff.max.ms
	// and reconnect.backoff.max.ms in one.
	//
	// The first wait is short because the commonest retriable answer in a harvester's life is
	// not a broker in trouble but the ordinary wait for the previous transaction's markers:
	// Kafka 4 answers the next transaction's note (TxnOffsetCommit) COORDINATOR_LOAD_IN_PROGRESS
	// until they are written, milliseconds after the commit. At kgo's backoff a note took 250ms,
	// and 3-5s when refused again while the backoff doubled. The most is short because after a
	// broker's crash a producer finds the partitions' new leaders and its transaction
	// coordinator's successor only on its next try after Kafka fenced the broker, up to the most
	// later (int.TestBrokerCrashChangesNoLeader reports each shard's first commit after the
	// fence). While a broker is down, each
	// connection a client keeps to it is tried again up to four times a second, refused by its
	// host, each try followed by a metadata request to another broker. Config.Opts can set
	// another backoff.
	//
	// kgo gives up on a request (all but produce requests, which the delivery timeout bounds)
	// after 20 tries whatever the time: at these waits after about 4s, less than Kafka takes to
	// fence a crashed broker (broker.session.timeout.ms, 9s). The producers' requests are
	// therefore tried for as long as kgo's RetryTimeout (30s) allows, however often.
	DefaultRetryBackoff    = 10 * time.Millisecond
	DefaultRetryBackoffMax = 250 * time.Millisecond
	// DefaultElectionRetryBackoffMax is the most of the election's backoff (from
	// DefaultRetryBackoff, doubling), as short as the producers' for a reason of its own. A group
	// completes a rebalance only once its slowest member has joined, and after its coordinator's
	// crash every member was refused since the crash: at a second, one would ask again up to a
	// second after the new coordinator served, and hold back every shard of the group that long
	// (int.TestGroupCoordinatorCrash).
	// The election has two clients per outbox, so asking four times a second while the
	// coordinator is away costs the brokers little.
	DefaultElectionRetryBackoffMax = 250 * time.Millisecond
	// DefaultMetadataMinAge is kgo.MetadataMinAge, the least time between two metadata requests;
	// kgo's own is 5s. kgo retries a produce that Kafka answered with a retriable error only
	// after its next metadata request, and Kafka 4 answers NOT_ENOUGH_REPLICAS to a
	// transaction's first produce while the previous transaction's markers are still being
	// written (KIP-890's answer for clients that predate it): at 5s, such a produce waited up to
	// 5s, milliseconds after the commit. Config.Opts can set another.
	DefaultMetadataMinAge = 10 * time.Millisecond
	// DefaultMaxQueued is how many messages a producer holds, queued or in flight, before Produce
	// returns driver.ErrQueueFull: librdkafka's queue.buffering.max.messages default.
	DefaultMaxQueued = 100_000
	// NoLinger, as Config.Linger, sends each batch at once (kgo.ProducerLinger(0)), as
	// linger.ms 0 does in librdkafka; Linger 0 means DefaultLinger.
	NoLinger time.Duration = -1
)

// Config is the client's settings. The zero value of each field but SeedBrokers means its
// default. FromProperties makes one from librdkafka's properties.
type Config struct {
	// SeedBrokers are the brokers to bootstrap from (kgo.SeedBrokers). Required.
	SeedBrokers []string
	// Opts are further kgo options for every client this one makes, producers and election
	// alike, such as kgo.DialTLSConfig, kgo.SASL or kgo.Dialer.
	Opts []kgo.Opt
	// ProducerOpts are further kgo options for producers only, applied after Opts, which they
	// therefore override. Both are applied before the options the producer sets itself, which
	// therefore win: the transactional ID, acks, partitioner, linger, transaction timeout,
	// buffer limit, topic creation on demand and logger, and the client ID and delivery timeout
	// (see ClientID and DeliveryTimeout). (Idempotence comes with the transactional ID.) Opts may
	// replace goharvest's retry backoff (DefaultRetryBackoff) and metadata age (DefaultMetadataMinAge),
	// which come before them. kgo's own wait on CONCURRENT_TRANSACTIONS stays its default (20ms,
	// longer as the answer lasts): InitProducerID gets that answer for as long as a deposed
	// leader's transaction takes to abort, and at 2ms a successor would ask up to 500 times in
	// its first second, per shard.
	ProducerOpts []kgo.Opt
	// ClientID is the producers' kgo.ClientID; "" means driver.ProducerConfig's.
	ClientID string
	// Linger is kgo.ProducerLinger, at most a minute (kgo's limit); 0 means DefaultLinger, and
	// NoLinger (or any negative value) none.
	Linger time.Duration
	// DeliveryTimeout is kgo.RecordDeliveryTimeout, at least a second (kgo's limit); 0 means
	// driver.ProducerConfig's.
	DeliveryTimeout time.Duration
	// TransactionTimeout is kgo.TransactionTimeout (the broker's transaction.timeout.ms for this
	// producer); 0 means DefaultTransactionTimeout. It is raised to the producer's delivery
	// timeout when that is longer.
	TransactionTimeout time.Duration
	// MaxQueued is how many messages a producer holds, queued or in flight, before Produce
	// returns driver.ErrQueueFull; 0 means DefaultMaxQueued.
	MaxQueued int
}

// Client makes franz-go producers. It holds no connection of its own.
type Client struct{ cfg Config }

// New returns a client with cfg's settings (copied). It contacts no broker.
func New(cfg Config) *Client {
	cfg.SeedBrokers = slices.Clone(cfg.SeedBrokers)
	cfg.Opts = slices.Clone(cfg.Opts)
	cfg.ProducerOpts = slices.Clone(cfg.ProducerOpts)
	return &Client{cfg: cfg}
}

// NewProducer creates a transactional producer. It contacts no broker: InitTransactions does.
func (c *Client) NewProducer(p driver.ProducerConfig) (driver.KafkaProducer, error) {
	if len(c.cfg.SeedBrokers) == 0 {
		return nil, errors.New("franz: Config.SeedBrokers is empty")
	}
	if p.TransactionalID == "" {
		return nil, errors.New("franz: ProducerConfig.TransactionalID is empty")
	}
	logger := p.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	deliveryTimeout := cmp.Or(c.cfg.DeliveryTimeout, p.DeliveryTimeout)
	txnTimeout := cmp.Or(c.cfg.TransactionTimeout, DefaultTransactionTimeout)
	txnTimeout = max(txnTimeout, deliveryTimeout)
	maxQueued := cmp.Or(c.cfg.MaxQueued, DefaultMaxQueued)
	linger := max(cmp.Or(c.cfg.Linger, DefaultLinger), 0) // NoLinger: 0
	// goharvest's defaults first, so that the configured options can replace them.
	// No compression unless configured, as librdkafka's default (kgo's is snappy): the same
	// properties give the same records, and the clients compare on equal terms.
	opts := []kgo.Opt{kgo.RetryBackoffFn(backoff(DefaultRetryBackoff, DefaultRetryBackoffMax)), kgo.RequestRetries(math.MaxInt32),
		kgo.MetadataMinAge(DefaultMetadataMinAge), kgo.ProducerBatchCompression(kgo.NoCompression())}
	opts = append(opts, c.cfg.Opts...)
	opts = append(opts, c.cfg.ProducerOpts...)
	opts = append(opts,
		kgo.SeedBrokers(c.cfg.SeedBrokers...),
		kgo.TransactionalID(p.TransactionalID),
		kgo.TransactionTimeout(txnTimeout),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(linger),
		// Keys hash with murmur2 as the Java client's and librdkafka's "murmur2_random"
		// partitioners do, the empty key included; a nil key goes to a partition of kgo's choice,
		// as librdkafka's goes to a random one.
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		// Produce counts what it has queued against maxQueued itself, so that it can refuse at
		// once. kgo's own limit must then never be reached, or kgo would fail the message that
		// reaches it; kgo counts a message a moment longer than Produce does (until just after
		// its promise), so its limit has room to spare.
		kgo.MaxBufferedRecords(2*maxQueued),
		// A broker that creates topics on demand creates a message's topic, as it does for
		// librdkafka's producer (see the topic check in producer.Produce).
		kgo.AllowAutoTopicCreation(),
		kgo.WithLogger(slogLogger{logger}),
	)
	if clientID := cmp.Or(c.cfg.ClientID, p.ClientID); clientID != "" {
		opts = append(opts, kgo.ClientID(clientID))
	}
	if deliveryTimeout > 0 {
		opts = append(opts, kgo.RecordDeliveryTimeout(deliveryTimeout))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("franz: create client: %w", err)
	}
	// The notes client of a cluster without KIP-890 part 2 (see producer.notes): the same
	// brokers, security and client ID as the producer, no transactional ID of its own, and
	// TxnOffsetCommit and EndTxn held to v4, which kgo offers no other way to pin on one request
	// (v5 of each is KIP-890 part 2's).
	notesOpts := []kgo.Opt{kgo.RetryBackoffFn(backoff(DefaultRetryBackoff, DefaultRetryBackoffMax)), kgo.RequestRetries(math.MaxInt32),
		kgo.MetadataMinAge(DefaultMetadataMinAge)}
	notesOpts = append(notesOpts, c.cfg.Opts...)
	notesOpts = append(notesOpts, c.cfg.ProducerOpts...)
	versions := kversion.Stable()
	versions.SetMaxKeyVersion(int16(kmsg.TxnOffsetCommit), maxTV1Version)
	versions.SetMaxKeyVersion(int16(kmsg.EndTxn), maxTV1Version)
	notesOpts = append(notesOpts, kgo.SeedBrokers(c.cfg.SeedBrokers...), kgo.WithLogger(slogLogger{logger}), kgo.MaxVersions(versions))
	if clientID := cmp.Or(c.cfg.ClientID, p.ClientID); clientID != "" {
		notesOpts = append(notesOpts, kgo.ClientID(clientID))
	}
	newNotes := func() (*kgo.Client, error) { return kgo.NewClient(notesOpts...) }
	return newProducer(cl, newNotes, p.TransactionalID, txnTimeout, maxQueued), nil
}

// backoff returns a retry backoff for kgo.RetryBackoffFn shaped as kgo's own: first after the
// first failure, doubled after each further one up to most, each wait jittered by ±20% (and never
// above most) so that clients that failed together do not retry in step.
func backoff(first, most time.Duration) func(fails int) time.Duration {
	return func(fails int) time.Duration {
		d := first
		for i := 1; i < fails && d < most; i++ {
			d *= 2
		}
		return min(time.Duration(float64(d)*(0.8+0.4*rand.Float64())), most)
	}
}

// slogLogger forwards kgo's logs to a slog.Logger. kgo logs every transaction's begin and end at
// its info level, so that level becomes slog's debug; its debug logs are not asked for.
type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Level() kgo.LogLevel { return kgo.LogLevelInfo }

func (s slogLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	l := slog.LevelDebug
	switch level {
	case kgo.LogLevelError:
		l = slog.LevelError
	case kgo.LogLevelWarn:
		l = slog.LevelWarn
	}
	s.l.Log(context.Background(), l, msg, keyvals...)
}
