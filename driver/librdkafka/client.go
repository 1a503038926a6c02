// Package librdkafka is goharvest's Kafka client on librdkafka, through confluent-kafka-go (cgo):
// the transactional producer and the leader election (package neli). It implements driver.Kafka.
//
//	kafka := librdkafka.New(librdkafka.Config{
//		Properties: map[string]any{"bootstrap.servers": "localhost:9092"},
//	})
//	h, err := goharvest.New(goharvest.Config{Kafka: kafka, ...})
//
// goharvest.Config's BaseKafkaConfig and ProducerKafkaConfig make this client when Config.Kafka
// is nil, in any build with cgo: that is how the reaper's YAML reaches it.
package librdkafka

import (
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/kafkaprops"
	"github.com/goharvest/goharvest/neli"
)

// Defaults the client gives its producers where the properties set none.
const (
	// DefaultLinger is the producer's "linger.ms" unless the properties set it (or its alias
	// "queue.buffering.max.ms"); librdkafka's own default is 5. The transaction loop already
	// gathers records between commits, and a commit sends what is queued at once; librdkafka's
	// own wait would only delay each delivery report, and with it the commit that releases a
	// key's next record.
	DefaultLinger = 1
	// DefaultTransactionTimeout is librdkafka's transaction.timeout.ms, which the producer keeps
	// unless the properties set it or a longer delivery timeout needs more (librdkafka refuses a
	// message timeout longer than the transaction timeout).
	DefaultTransactionTimeout = time.Minute
	// DefaultPartitioner is the producer's "partitioner" unless the properties set it:
	// librdkafka's Java-compatible one, which puts every key (the empty key included) on the
	// partition the Java client's default partitioner would choose, so that topics written by
	// goharvest co-partition with those of Java producers, Kafka Streams and ksqlDB. librdkafka's
	// own default is "consistent_random" (CRC32).
	DefaultPartitioner = "murmur2_random"
	// DefaultReconnectBackoffMax is the producer's "reconnect.backoff.max.ms" unless the
	// properties set it; librdkafka's own default is 10s. A producer whose transaction
	// coordinator crashed asks for the new one only when a connection to the old one fails
	// again, and librdkafka spaces those attempts out up to this: at 10s the shards of that
	// coordinator published again 14-20s after the crash, at 1s with every other shard, about a
	// second after Kafka fenced the broker (docs/operations.md, Cluster events); at 250ms a
	// retry follows the fence as closely as DefaultRetryBackoffMax lets it. The cost is four
	// connection attempts a second to a broker that stays down, refused by its host.
	DefaultReconnectBackoffMax = 250 * time.Millisecond
	// DefaultRetryBackoffMax is the producer's "retry.backoff.max.ms" unless the properties set
	// it or "retry.backoff.ms"; librdkafka's own default is 1s. librdkafka doubles its wait
	// before a request's next try, and before asking again for the metadata of a partition
	// whose leader it lost, from retry.backoff.ms up to this: after a broker's crash, a
	// producer learns of the partitions' new leaders only on its next try after Kafka fenced
	// the broker, up to a second later at librdkafka's default (int.TestBrokerCrashChangesNoLeader
	// reports each shard's first commit after the fence). librdkafka bounds a
	// message's tries by its timeout (message.timeout.ms), not by their count, so shorter waits
	// make it give up no sooner.
	DefaultRetryBackoffMax = 250 * time.Millisecond
	// DefaultRetryBackoff is the producer's "retry.backoff.ms" unless the properties set it;
	// librdkafka's own default is 100ms (doubling up to retry.backoff.max.ms). librdkafka has
	// no part of KIP-890: a transaction's note asks for AddOffsetsToTxn, which Kafka answers
	// CONCURRENT_TRANSACTIONS until the previous transaction's markers are written, milliseconds
	// after its commit, and librdkafka asks again after retry.backoff.ms. Its eos debug log shows
	// that retry in every transaction with a note: at 100ms a one-record transaction with a note
	// took 105-108ms at the median on Apache Kafka 4.4, at 10ms 14ms. Produce retries wait as
	// long, doubling as before.
	DefaultRetryBackoff = 10 * time.Millisecond
	// DefaultEventsChannelSize is go.events.channel.size, the slots of the Go client's channel of
	// delivery reports, unless set (its default: a million, 16 MB made at once).
	DefaultEventsChannelSize = 10_000
)

// Config is the client's settings: librdkafka properties.
type Config struct {
	// Properties are shared by the producers and the election's clients: "bootstrap.servers" and
	// any security settings (goharvest.Config.BaseKafkaConfig). The properties the client owns
	// (see Problems) are refused.
	Properties map[string]any
	// ProducerProperties are added to Properties for the producers only
	// (goharvest.Config.ProducerKafkaConfig).
	ProducerProperties map[string]any
}

// Client makes librdkafka producers and neli electors. It holds no connection of its own.
type Client struct{ cfg Config }

var _ driver.Kafka = (*Client)(nil)

// New returns a client with cfg's properties (copied). It contacts no broker.
func New(cfg Config) *Client {
	return &Client{cfg: Config{Properties: maps.Clone(cfg.Properties), ProducerProperties: maps.Clone(cfg.ProducerProperties)}}
}

// NewProducer creates a transactional producer with ProducerSettings' properties.
func (c *Client) NewProducer(p driver.ProducerConfig) (driver.KafkaProducer, error) {
	return newProducer(c.ProducerSettings(p), p.Logger)
}

// NewElector creates a neli election, with the shared properties.
func (c *Client) NewElector(e driver.ElectorConfig) (driver.Elector, error) {
	n, err := neli.New(neli.Config{
		KafkaConfig:      c.cfg.Properties,
		LeaderTopic:      e.LeaderTopic,
		LeaderGroupID:    e.LeaderGroupID,
		Partitions:       e.Partitions,
		Name:             e.Name,
		HeartbeatTimeout: e.HeartbeatTimeout,
		PollDuration:     e.PollDuration,
		MinPollInterval:  e.MinPollInterval,
		Barrier:          e.Barrier,
		Logger:           e.Logger,
	})
	if err != nil {
		return nil, err
	}
	return Elector(n), nil
}

// Problem is a property the client refuses.
type Problem struct {
	// Producer is true for a property of ProducerProperties, false for one of Properties.
	Producer bool
	Property string
	Reason   string
}

// Problems returns every property of the config that the client refuses, for producers whose
// delivery timeout is deliveryTimeout (driver.ProducerConfig): a property goharvest sets itself,
// a value that is not a string, number or boolean, a transaction timeout shorter than the
// message timeout.
func (c Config) Problems(deliveryTimeout time.Duration) []Problem {
	var problems []Problem
	check := func(producer bool, m map[string]any) {
		for _, key := range slices.Sorted(maps.Keys(m)) {
			if why, owned := kafkaprops.Owned(key); owned {
				problems = append(problems, Problem{producer, key, fmt.Sprintf("goharvest sets this property itself (%s); remove it", why)})
				continue
			}
			switch m[key].(type) {
			case string, bool, int, int64, float64:
			default:
				problems = append(problems, Problem{producer, key, fmt.Sprintf("value must be a string, number or boolean, got %T", m[key])})
			}
		}
	}
	check(false, c.Properties)
	check(true, c.ProducerProperties)
	if txn, set := c.millis("transaction.timeout.ms"); set {
		if msg := c.messageTimeout(deliveryTimeout); txn < msg {
			problems = append(problems, Problem{true, "transaction.timeout.ms",
				fmt.Sprintf("%v is shorter than the message timeout (%v, from queueTimeout or message.timeout.ms); librdkafka refuses that", txn, msg)})
		}
	}
	return problems
}

// ProducerSettings returns the librdkafka properties of a producer: the configured ones,
// goharvest's defaults where they set none, and the properties goharvest owns (see
// kafkaprops.Producer).
func (c *Client) ProducerSettings(p driver.ProducerConfig) map[string]any {
	settings := maps.Clone(c.cfg.Properties)
	if settings == nil {
		settings = map[string]any{}
	}
	maps.Copy(settings, c.cfg.ProducerProperties)
	if _, ok := c.cfg.ProducerProperties["client.id"]; !ok && p.ClientID != "" {
		settings["client.id"] = p.ClientID
	}
	_, hasMessageTimeout := settings["message.timeout.ms"]
	_, hasDeliveryTimeout := settings["delivery.timeout.ms"]
	if !hasMessageTimeout && !hasDeliveryTimeout && p.DeliveryTimeout > 0 {
		settings["message.timeout.ms"] = int(p.DeliveryTimeout.Milliseconds())
	}
	if _, ok := settings["transaction.timeout.ms"]; !ok {
		settings["transaction.timeout.ms"] = int(max(DefaultTransactionTimeout, c.cfg.messageTimeout(p.DeliveryTimeout)).Milliseconds())
	}
	_, hasLinger := settings["linger.ms"]
	_, hasLingerAlias := settings["queue.buffering.max.ms"]
	if !hasLinger && !hasLingerAlias {
		settings["linger.ms"] = DefaultLinger
	}
	if _, set := settings["partitioner"]; !set {
		settings["partitioner"] = DefaultPartitioner
	}
	if _, set := settings["reconnect.backoff.max.ms"]; !set {
		settings["reconnect.backoff.max.ms"] = int(DefaultReconnectBackoffMax.Milliseconds())
	}
	if _, set := settings["retry.backoff.ms"]; !set {
		settings["retry.backoff.ms"] = int(DefaultRetryBackoff.Milliseconds())
		// Only beside goharvest's first wait: librdkafka would hold a longer first wait of the
		// user's at this most.
		if _, set := settings["retry.backoff.max.ms"]; !set {
			settings["retry.backoff.max.ms"] = int(DefaultRetryBackoffMax.Milliseconds())
		}
	}
	// The Go client makes its channels at full size at once, and defaults them to a million
	// slots each (24 MB a producer, which a garbage collection can make resident): its delivery
	// reports are read as they come (see forward), and nothing uses the produce channel.
	if _, set := settings["go.events.channel.size"]; !set {
		settings["go.events.channel.size"] = DefaultEventsChannelSize
	}
	if _, set := settings["go.produce.channel.size"]; !set {
		settings["go.produce.channel.size"] = 0
	}
	maps.Copy(settings, map[string]any{
		"enable.idempotence":  true,
		"acks":                "all",
		"go.delivery.reports": true,
		"transactional.id":    p.TransactionalID,
	})
	return settings
}

// millis returns a producer property given in milliseconds, and whether it is set (to a value
// that reads as a number).
func (c Config) millis(key string) (time.Duration, bool) {
	v, ok := c.ProducerProperties[key]
	if !ok {
		v, ok = c.Properties[key]
	}
	if !ok {
		return 0, false
	}
	// Numbers of any type, and strings (as YAML and librdkafka allow), read alike.
	var ms float64
	if _, err := fmt.Sscan(fmt.Sprint(v), &ms); err != nil {
		return 0, false
	}
	return time.Duration(ms * float64(time.Millisecond)), true
}

// messageTimeout is how long the producer tries to deliver a message: message.timeout.ms (or its
// alias delivery.timeout.ms) if set, else the harvester's delivery timeout.
func (c Config) messageTimeout(deliveryTimeout time.Duration) time.Duration {
	if d, ok := c.millis("message.timeout.ms"); ok {
		return d
	}
	if d, ok := c.millis("delivery.timeout.ms"); ok {
		return d
	}
	return deliveryTimeout
}
