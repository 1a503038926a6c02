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

	"github.com/goharvest/goharvest/internal/rdlog"
	"github.com/goharvest/goharvest/internal/timing"
	"github.com/goharvest/goharvest/outbox"
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
	// OwnedProperties are set by NELI and rejected here.
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

	// HeartbeatTimeout is how long a leader may go without receiving its own heartbeat before it
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
// value would break the guarantee that a leader fences itself before another is elected.
var OwnedProperties = map[string]string{
	"group.id":                        "set from the leader group ID",
	"group.instance.id":               "static membership would delay handing leadership over when a contender dies",
	"enable.auto.commit":              "leader election commits no offsets",
	"enable.auto.offset.store":        "leader election commits no offsets",
	"auto.offset.reset":               "leader election reads only its own heartbeats",
	"session.timeout.ms":              "derived from the heartbeat timeout so that a leader fences itself before its partition can be reassigned",
	"heartbeat.interval.ms":           "derived from the heartbeat timeout",
	"max.poll.interval.ms":            "derived from the heartbeat timeout",
	"partition.assignment.strategy":   "leader election relies on cooperative-sticky: balanced, moving as few partitions as it can, each revoked before it is assigned again",
	"group.protocol":                  "leader election uses the classic group protocol",
	"go.application.rebalance.enable": "leader election handles rebalances itself",
}

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
	if err := outbox.CheckName(c.LeaderTopic); err != nil {
		bad("LeaderTopic %q: %v", c.LeaderTopic, err)
	}
	if err := outbox.CheckName(c.LeaderGroupID); err != nil {
		bad("LeaderGroupID %q: %v", c.LeaderGroupID, err)
	}
	if strings.TrimSpace(c.Name) == "" {
		bad("Name: required")
	}
	if c.Partitions < 1 || c.Partitions > MaxPartitions {
		bad("Partitions %d: out of range [1, %d]", c.Partitions, MaxPartitions)
	}
	for _, p := range c.election().Problems() {
		bad("%s %v: %s", p.Field, p.Value, p.Reason)
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
// A leader cut off from Kafka at time t has read its last heartbeat by t, so it fences itself by
// t + heartbeatTimeout. The coordinator last heard from it no earlier than t - heartbeatInterval
// and so evicts it no earlier than t + sessionTimeout - heartbeatInterval = t + 1.9 heartbeat
// timeouts. A leader whose loop stalls stops reading heartbeats at once and is fenced after one
// heartbeat timeout, while librdkafka only leaves the group after maxPollInterval, two of them.
// Either way the old leader is fenced before any other member can be given its partitions.
func timeouts(heartbeatTimeout time.Duration) (session, heartbeatInterval, maxPoll time.Duration) {
	return 2 * heartbeatTimeout, heartbeatTimeout / 10, 2 * heartbeatTimeout
}

// consumerConfig builds the election consumer's properties.
func (c Config) consumerConfig() kafka.ConfigMap {
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
		"enable.auto.commit":            false,
		"enable.auto.offset.store":      false,
		"auto.offset.reset":             "latest",
		"session.timeout.ms":            int(session.Milliseconds()),
		"heartbeat.interval.ms":         max(1, int(interval.Milliseconds())),
		"max.poll.interval.ms":          int(maxPoll.Milliseconds()),
		"partition.assignment.strategy": "cooperative-sticky",
		// A heartbeat should be seen as soon as it lands, not after a full fetch wait.
		"fetch.wait.max.ms": max(1, int(interval.Milliseconds())),
	})
	rdlog.Enable(cm)
	return cm
}

// heartbeatConsumerConfig builds the properties of the consumer that reads heartbeats back. It is
// assigned its partition and never joins the group; librdkafka requires a group.id all the same,
// and the election's own is one the contender's principal may already use.
func (c Config) heartbeatConsumerConfig() kafka.ConfigMap {
	cm := c.consumerConfig()
	cm["client.id"] = c.Name + ".heartbeats"
	delete(cm, "partition.assignment.strategy")
	return cm
}

// producerConfig builds the heartbeat producer's properties. A heartbeat older than the timeout
// proves nothing, so the producer gives up on it rather than delivering it late.
func (c Config) producerConfig() kafka.ConfigMap {
	cm := kafka.ConfigMap{"client.id": c.Name + ".heartbeat"}
	for k, v := range c.KafkaConfig {
		cm[k] = v
	}
	maps.Copy(cm, kafka.ConfigMap{
		"linger.ms":           0,
		"message.timeout.ms":  max(1, int(c.HeartbeatTimeout.Milliseconds())),
		"go.delivery.reports": false,
	})
	rdlog.Enable(cm)
	return cm
}
