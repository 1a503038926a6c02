package goharvest

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/engine/epoch"
	"github.com/goharvest/goharvest/internal/engine/owner"
	"github.com/goharvest/goharvest/internal/strictyaml"
	"github.com/goharvest/goharvest/outbox"
)

// Defaults of Config. A zero field takes its default.
const (
	// DefaultLeaderTopicPrefix is put before LeaderGroupID to make the default LeaderTopic.
	DefaultLeaderTopicPrefix = "goharvest.neli."
	// DefaultClaimStrategy is ClaimRead: the database pays only for each record's INSERT and
	// DELETE.
	DefaultClaimStrategy = ClaimRead
)

// ClaimStrategy is how an epoch claims the rows it publishes (Config.ClaimStrategy). Its YAML
// form is its string; Validate refuses any value but the constants below.
type ClaimStrategy string

// The claim strategies.
const (
	// ClaimRead reads rows without changing them; the binding must be a driver.Reader, as the
	// Postgres binding is.
	ClaimRead ClaimStrategy = "read"
	// ClaimMark marks rows with the epoch's leader ID before publishing them (DatabaseBinding.Mark).
	ClaimMark ClaimStrategy = "mark"
)

// engineClaim is the engine's value for a strategy; ok is false for a value that is none.
func (s ClaimStrategy) engineClaim() (claim owner.Claim, ok bool) {
	switch s {
	case ClaimRead:
		return owner.ClaimByReading, true
	case ClaimMark:
		return owner.ClaimByMarking, true
	}
	return 0, false
}

// Config configures a harvester. The zero value of every field means its documented default;
// the caller's Config is never modified. Unmarshal reads one from YAML, using the names in the
// yaml tags.
type Config struct {
	// Store is the outbox, opened by a store driver: postgres.New or postgres.NewWithPool
	// (package driver/postgres), or any driver.Store such as the in-memory one
	// (driver/memory). Required. Start takes it over: the harvester disposes of it when it stops,
	// or at once if Start fails. A harvester that is never started leaves it to the caller.
	Store driver.DatabaseBinding `yaml:"-"`

	// Kafka is the Kafka client, which makes each epoch's producer and the leader election:
	// franz.New (package driver/franz, pure Go), librdkafka.New (driver/librdkafka, cgo) or any
	// driver.Kafka such as the in-memory one (driver/memory). Required.
	Kafka driver.Kafka `yaml:"-"`

	// LeaderTopic is the topic whose partitions decide leadership, one per shard (partition 0
	// alone with one shard). All harvesters of one
	// outbox must share it, and nothing else may. Default: DefaultLeaderTopicPrefix followed by
	// LeaderGroupID. A warning is logged when the default is used.
	LeaderTopic string `yaml:"leaderTopic"`

	// LeaderGroupID is the consumer group that contending harvesters join. All harvesters of one
	// outbox must share it, and nothing else may. Default: the executable's file name, with
	// characters Kafka does not allow replaced by '_'. A warning is logged when the default is
	// used, because unrelated programs with the same name (or a debugger's __debug_bin) would
	// otherwise compete for one leadership.
	LeaderGroupID string `yaml:"leaderGroupID"`

	// IDHeader, when set, names a header that every message carries with its outbox row's id
	// in decimal ("12345"), after the row's own headers. A record published again (at least
	// once) carries the same id, so consumers can drop repeats. Default: "" (no such header).
	IDHeader string `yaml:"idHeader"`

	// ClaimStrategy is how an epoch claims the rows it publishes (see docs/how-it-works.md, How
	// rows are claimed). ClaimRead reads them and writes nothing to a row but its purge; ClaimMark, the
	// original goharvest's mark-and-purge, sets each row's leader_id first, an UPDATE per record.
	// Either keeps every guarantee. Default: DefaultClaimStrategy.
	ClaimStrategy ClaimStrategy `yaml:"claimStrategy"`

	// Shards splits the outbox by key into this many shards, each published by one harvester at a
	// time, so that several harvesters publish at once (see docs/operations.md, Scaling out). A record's shard
	// is outbox.Shard of its key; the leader topic gets one partition per shard, and each shard has
	// a transactional ID of its own. Every harvester of the group must have the same value. With
	// more than one, the outbox needs the index outbox.ShardIndexDDL makes. Default 1 (range 1 to
	// outbox.MaxShards): one harvester publishes, the others stand by.
	Shards int `yaml:"shards"`

	// Limits tunes timing and throughput.
	Limits Limits `yaml:"limits"`

	// Name identifies this harvester in logs and as its group member name. Default: host name,
	// process ID and start time, e.g. "host_4242_1700000000".
	Name string `yaml:"name"`

	// Logger receives the harvester's logs. Default: slog.Default().
	Logger *slog.Logger `yaml:"-"`

	// MetricsRegisterer receives the harvester's Prometheus metrics (see docs/monitoring.md for the list).
	// Default: prometheus.DefaultRegisterer.
	MetricsRegisterer prometheus.Registerer `yaml:"-"`

	// TracerProvider, when set, makes the harvester record an OpenTelemetry span for each record
	// it publishes, linked to the trace in the record's traceparent header. Default: none, and
	// then tracing costs nothing.
	TracerProvider trace.TracerProvider `yaml:"-"`
}

// Limits tunes the harvester's timing and throughput (Config.Limits). The zero value of every
// field means its default, which docs/configuration.md lists with each field's range; the
// engine (package internal/engine/epoch) declares the fields, their defaults and their ranges once.
type Limits = epoch.Limits

// Unmarshal reads a Config from YAML. Unknown keys and values of the wrong type are errors that
// name the key and its line; durations are written with a unit ("5s", "100ms"). Defaults are not
// applied and the result is not validated: New does both, and callers may amend the Config first.
func Unmarshal(data []byte) (Config, error) {
	var c Config
	if err := strictyaml.Unmarshal(data, &c); err != nil {
		return Config{}, fmt.Errorf("harvest config: %w", err)
	}
	return c, nil
}

// WithDefaults returns a copy of c in which every zero field holds its default. When
// LeaderGroupID or LeaderTopic is defaulted, a warning is logged through the (possibly defaulted)
// Logger. Store and Kafka have no default: the caller chooses the drivers.
func (c Config) WithDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MetricsRegisterer == nil {
		c.MetricsRegisterer = prometheus.DefaultRegisterer
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.LeaderGroupID == "" {
		c.LeaderGroupID = topicSafe(filepath.Base(os.Args[0]))
		c.Logger.Warn("leaderGroupID not set; defaulting to the executable's name, which every harvester of this outbox must share and nothing else may use",
			"leaderGroupID", c.LeaderGroupID)
	}
	if c.LeaderTopic == "" {
		c.LeaderTopic = DefaultLeaderTopicPrefix + c.LeaderGroupID
		c.Logger.Warn("leaderTopic not set; defaulting from the group ID", "leaderTopic", c.LeaderTopic)
	}
	if c.ClaimStrategy == "" {
		c.ClaimStrategy = DefaultClaimStrategy
	}
	if c.Name == "" {
		host, err := os.Hostname()
		if err != nil {
			host = "localhost"
		}
		c.Name = fmt.Sprintf("%s_%d_%d", topicSafe(host), os.Getpid(), time.Now().Unix())
	}
	c.Limits = c.Limits.WithDefaults()
	return c
}

// topicSafe replaces what a Kafka name may not hold (see outbox.NameChar) with '_', to make a
// default group ID or name from a host or program name.
func topicSafe(s string) string {
	return strings.Map(func(r rune) rune {
		if outbox.NameChar(r) {
			return r
		}
		return '_'
	}, s)
}

// Validate checks the settings of a Config whose defaults have been applied (see WithDefaults).
// It reports every problem, each naming the field (with its YAML key) and what is allowed. The
// drivers, Store and Kafka, are New's to require: Validate can check settings before they are
// made.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, yamlKey, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s (%s): %s", field, yamlKey, fmt.Sprintf(format, args...)))
	}

	checkTopicLike := func(field, yamlKey, value string) {
		if err := outbox.CheckName(value); err != nil {
			bad(field, yamlKey, "%q: %v", value, err)
		}
	}
	checkTopicLike("LeaderTopic", "leaderTopic", c.LeaderTopic)
	checkTopicLike("LeaderGroupID", "leaderGroupID", c.LeaderGroupID)

	if c.Shards < 1 || c.Shards > outbox.MaxShards {
		bad("Shards", "shards", "%d is out of range [1, %d]", c.Shards, outbox.MaxShards)
	}
	if _, ok := c.ClaimStrategy.engineClaim(); !ok {
		bad("ClaimStrategy", "claimStrategy", "%q: must be %q or %q", c.ClaimStrategy, ClaimRead, ClaimMark)
	}
	if c.IDHeader != "" && (strings.TrimSpace(c.IDHeader) != c.IDHeader || !utf8.ValidString(c.IDHeader) || strings.ContainsRune(c.IDHeader, 0)) {
		bad("IDHeader", "idHeader", "%q: a header name must be valid UTF-8 without NUL bytes or surrounding blanks; or empty for no id header", c.IDHeader)
	}
	if strings.TrimSpace(c.Name) == "" {
		bad("Name", "name", "must not be blank")
	}
	if c.Logger == nil {
		bad("Logger", "-", "must not be nil")
	}
	errs = append(errs, c.Limits.Validate()...)
	if len(errs) > 0 {
		return fmt.Errorf("invalid harvest config: %w", errors.Join(errs...))
	}
	return nil
}
