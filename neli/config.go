package neli

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/goharvest/goharvest/internal/kafkaprops"
	"github.com/goharvest/goharvest/internal/leadership"
	"github.com/goharvest/goharvest/internal/rdlog"
	"github.com/goharvest/goharvest/internal/timing"
)

// Defaults of Config. A zero field takes its default.
const (
	DefaultHeartbeatTimeout = timing.DefaultHeartbeatTimeout
	DefaultPollDuration     = timing.DefaultPollDuration
	DefaultMinPollInterval  = timing.DefaultMinPollInterval
)

// MaxPartitions bounds Config.Partitions.
const MaxPartitions = 1024

// Config configures one contender for leadership.
type Config struct {
	// KafkaConfig holds librdkafka properties for the election's consumer and heartbeat producer:
	// "bootstrap.servers" (required) and any security settings. The properties listed in
	// OwnedProperties are set by NELI and rejected here; the heartbeat producer also always runs
	// with acks=1 and without idempotence (see doc.go, Safety).
	KafkaConfig map[string]any

	// LeaderTopic is the topic whose partitions are led: whoever the group assigns a partition
	// leads it. It is created with Partitions partitions if it does not exist, and partitions are
	// added if it has fewer. Required.
	LeaderTopic string

	// Partitions is how many partitions of LeaderTopic are led, each by one contender at a time;
	// the group spreads them evenly over the contenders. Default 1: one leader.
	Partitions int

	// LeaderGroupID is the consumer group of the contenders. Required.
	LeaderGroupID string

	// Name identifies this contender in logs, heartbeats and (as client.id, unless KafkaConfig
	// sets one) in the group. Required.
	Name string

	// HeartbeatTimeout is how long a leader may go without a heartbeat acknowledged before it
	// fences itself. The consumer's session.timeout.ms and max.poll.interval.ms are twice this and
	// heartbeat.interval.ms a tenth of it (see doc.go for why). Default: DefaultHeartbeatTimeout.
	HeartbeatTimeout time.Duration

	// PollDuration is how long one Pulse may block waiting for the consumer.
	// Default: DefaultPollDuration.
	PollDuration time.Duration

	// MinPollInterval is the time between pulses in Run. Default: DefaultMinPollInterval.
	// It must be below HeartbeatTimeout/2 so that heartbeats flow often enough.
	MinPollInterval time.Duration

	// OnEvent receives Acquired, SelfFenced and Revoked events, in order, on a
	// goroutine of its own: a slow or blocked handler delays later events but never the
	// election loop. Optional.
	OnEvent func(Event)

	// Barrier is called synchronously, on the goroutine that pulses, as soon as partitions are
	// lost (revoked, or all of them fenced), with those partitions, after Partitions has stopped
	// returning them. On a revoke, the group cannot assign them to another member until Barrier
	// returns, so a harvester can use it to stop sending and wait for its in-flight messages. It
	// must return well within HeartbeatTimeout: while it runs, the consumer is not polled. Optional.
	Barrier func(partitions []int32)

	// Logger receives the election's logs. Default: slog.Default().
	Logger *slog.Logger
}

// OwnedProperties are the Kafka properties NELI sets itself, each with the reason. A user
// value would break the guarantee that a leader fences itself before another is elected. The
// table lives in internal/kafkaprops, which the franz client, without cgo, reads too.
var OwnedProperties = kafkaprops.Election

// WithDefaults returns a copy of c in which every zero field holds its default. KafkaConfig is
// copied.
func (c Config) WithDefaults() Config {
	c.KafkaConfig = maps.Clone(c.KafkaConfig)
	election := c.election().WithDefaults()
	c.HeartbeatTimeout, c.PollDuration, c.MinPollInterval = election.HeartbeatTimeout, election.PollDuration, election.MinPollInterval
	if c.Partitions == 0 {
		c.Partitions = 1
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate checks a Config whose defaults have been applied, reporting every problem.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	for _, key := range slices.Sorted(maps.Keys(c.KafkaConfig)) {
		if why, owned := OwnedProperties[key]; owned {
			bad("KafkaConfig[%q]: NELI sets this property itself (%s); remove it", key, why)
		}
	}
	if s, _ := c.KafkaConfig["bootstrap.servers"].(string); strings.TrimSpace(s) == "" {
		bad(`KafkaConfig["bootstrap.servers"]: required`)
	}
	errs = append(errs, leadership.Problems(c.LeaderTopic, c.LeaderGroupID, c.Name, c.election())...)
	if c.Partitions < 1 || c.Partitions > MaxPartitions {
		bad("Partitions %d: out of range [1, %d]", c.Partitions, MaxPartitions)
	}
	if c.Logger == nil {
		bad("Logger: required")
	}
	return errors.Join(errs...)
}

// election returns the durations c shares with goharvest's Limits, whose defaults and ranges
// package timing holds.
func (c Config) election() timing.Election {
	return timing.Election{HeartbeatTimeout: c.HeartbeatTimeout, PollDuration: c.PollDuration, MinPollInterval: c.MinPollInterval}
}

// timeouts are the consumer-group timings derived from the heartbeat timeout.
//
// A leader cut off from Kafka at time t has had its last heartbeat acknowledged by t, so it fences
// itself by t + heartbeatTimeout. The coordinator last heard from it no earlier than t - heartbeatInterval
// and so evicts it no earlier than t + sessionTimeout - heartbeatInterval = t + 1.9 heartbeat
// timeouts. A leader whose loop stalls stops taking acknowledgements at once and is fenced after one
// heartbeat timeout, while librdkafka only leaves the group after maxPollInterval, two of them.
// Either way the old leader is fenced before any other member can be given its partitions.
func timeouts(heartbeatTimeout time.Duration) (session, heartbeatInterval, maxPoll time.Duration) {
	return 2 * heartbeatTimeout, heartbeatTimeout / 10, 2 * heartbeatTimeout
}

// consumerConfig builds the election consumer's properties; instance is its group.instance.id
// (see instanceID).
func (c Config) consumerConfig(instance string) kafka.ConfigMap {
	session, interval, maxPoll := timeouts(c.HeartbeatTimeout)
	cm := kafka.ConfigMap{
		"client.id": c.Name,
		// A contender whose metadata missed a change to the leader topic (created or grown
		// just before it joined) should not act on the stale view until librdkafka's default
		// refresh, five minutes later: a refresh each heartbeat timeout is one small request.
		"topic.metadata.refresh.interval.ms": int(c.HeartbeatTimeout.Milliseconds()),
	}
	for k, v := range c.KafkaConfig {
		cm[k] = v
	}
	maps.Copy(cm, kafka.ConfigMap{
		"group.id":                      c.LeaderGroupID,
		"group.instance.id":             instance,
		"enable.auto.commit":            false,
		"enable.auto.offset.store":      false,
		"auto.offset.reset":             "latest",
		"session.timeout.ms":            int(session.Milliseconds()),
		"heartbeat.interval.ms":         max(1, int(interval.Milliseconds())),
		"max.poll.interval.ms":          int(maxPoll.Milliseconds()),
		"partition.assignment.strategy": "cooperative-sticky",
	})
	rdlog.Enable(cm)
	return cm
}

// instanceID returns a static group membership (KIP-345) identity for one contender: its name,
// as far as Kafka allows the characters, and a random suffix.
//
// A contender's membership is static for one reason: when the group's coordinator crashes,
// the coordinator that takes over answers only after the controller has fenced the crashed
// broker (9s by default), and librdkafka drops its membership when no heartbeat is answered for
// a session (2H, 10s by default), which the takeover often outlasts. A dynamic member then joins
// again as a new member, and the new coordinator holds the rebalance until the old membership
// expires, a whole session more; a static member joining again takes its own old membership's
// place at once. The suffix makes the identity unique to the contender: two contenders sharing
// one would take each other's place, the second assigned the first's partitions while the first
// still leads them. librdkafka sends no LeaveGroup when a static member closes; Close leaves the
// group first (see leave). And librdkafka can take its own membership's fencing for another
// process's, a fatal error; the contender then replaces its consumer under the same identity
// (see replaceConsumer).
func (c Config) instanceID() string {
	name := []byte(c.Name)
	for i, b := range name {
		if !('a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '.' || b == '_' || b == '-') {
			name[i] = '_'
		}
	}
	// Kafka allows 249 characters; the suffix takes 17.
	return string(name[:min(len(name), 200)]) + "-" + leadership.NewTenure()
}

// producerConfig builds the heartbeat producer's properties. A heartbeat older than the timeout
// proves nothing, so the producer gives up on it rather than delivering it late. Its delivery
// report is the evidence a leader needs, and the partition leader's acknowledgement is enough
// for it (see leadership.Beat); idempotence, which would require acks=all, has nothing to guard
// in heartbeats, whose order and duplicates do not matter.
func (c Config) producerConfig() kafka.ConfigMap {
	cm := kafka.ConfigMap{"client.id": c.Name + ".heartbeat",
		// The Go client's channels are made at full size at once, 16 and 8 bytes a slot, and
		// default to a million slots each (24 MB a producer): a few heartbeats a second, read
		// at each pulse, need a few, and nothing uses the produce channel.
		"go.events.channel.size":  1000,
		"go.produce.channel.size": 0,
	}
	for k, v := range c.KafkaConfig {
		cm[k] = v
	}
	maps.Copy(cm, kafka.ConfigMap{
		"linger.ms":          0,
		"message.timeout.ms": max(1, int(c.HeartbeatTimeout.Milliseconds())),
		"acks":               1,
		// A producer learns of partitions added to a topic only when it next refreshes its
		// metadata, every 5 minutes by default; a contender assigned one of them heartbeats
		// through partition 0 meanwhile (see sendHeartbeat).
		"topic.metadata.refresh.interval.ms": max(1000, int(c.HeartbeatTimeout.Milliseconds())),
		"enable.idempotence":                 false,
		// Its metadata requests (Ping's among them) must not create the leader topic, with the
		// broker's default partition count, before ensureTopic creates it with Partitions.
		"allow.auto.create.topics":  false,
		"go.delivery.reports":       true,
		"go.delivery.report.fields": "none",
	})
	rdlog.Enable(cm)
	return cm
}
