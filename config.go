package goharvest

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/epoch"
	"github.com/goharvest/goharvest/internal/owner"
	"github.com/goharvest/goharvest/internal/pgname"
	"github.com/goharvest/goharvest/internal/strictyaml"
	"github.com/goharvest/goharvest/internal/timing"
	"github.com/goharvest/goharvest/outbox"
)

// Defaults of Config. A zero field takes its default.
const (
	// DefaultBootstrapServers is used when BaseKafkaConfig has no "bootstrap.servers".
	DefaultBootstrapServers = "localhost:9092"
	// DefaultDataSource is a local Postgres reached as user postgres.
	DefaultDataSource = "host=localhost port=5432 user=postgres dbname=postgres sslmode=disable"
	// DefaultOutboxTable is the outbox table's name.
	DefaultOutboxTable = "outbox"
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

// Defaults of Limits. A zero field takes its default. (The engine applies them: internal/epoch
// holds the same values, and TestLimitsDefaultsAreTheEngines holds the two equal.)
const (
	DefaultIOErrorBackoff        = 500 * time.Millisecond
	DefaultPollDuration          = time.Millisecond
	DefaultMinPollInterval       = 100 * time.Millisecond
	DefaultHeartbeatTimeout      = 5 * time.Second
	DefaultQueueTimeout          = 30 * time.Second
	DefaultMarkBackoff           = 10 * time.Millisecond
	DefaultMaxMarkBackoff        = time.Second
	DefaultMaxInFlightRecords    = 2000
	DefaultMaxKeyRun             = 1
	DefaultSendConcurrency       = 8
	DefaultSendBuffer            = 10
	DefaultMarkQueryRecords      = 500
	DefaultMinMetricsInterval    = 5 * time.Second
	DefaultBacklogSampleInterval = 10 * time.Second
	DefaultHeldCheckInterval     = time.Second
)

// KafkaConfigMap holds Kafka client properties, as librdkafka names them, such as
// "bootstrap.servers" or "compression.type". Values are strings, booleans or numbers, as YAML
// gives them.
type KafkaConfigMap map[string]any

// Config configures a harvester. The zero value of every field means its documented default;
// the caller's Config is never modified. Unmarshal reads one from YAML, using the names in the
// yaml tags.
type Config struct {
	// KafkaClient chooses the Kafka client that the harvester makes from BaseKafkaConfig and
	// ProducerKafkaConfig: KafkaClientLibrdkafka or KafkaClientFranz. Default:
	// DefaultKafkaClient(), franz-go's. It must be empty when Kafka is set.
	KafkaClient KafkaClient `yaml:"kafkaClient"`

	// BaseKafkaConfig holds the properties of the Kafka client that KafkaClient chooses, shared by
	// the leader election and the producer, such as "bootstrap.servers" (default
	// DefaultBootstrapServers) and security settings. They are named as librdkafka names them,
	// whichever the client; the franz client honours the ones franz.FromProperties maps, and
	// Validate refuses the others. Properties that goharvest must own to keep its guarantees
	// (group.id, session.timeout.ms, enable.auto.commit and the like) are refused by either.
	BaseKafkaConfig KafkaConfigMap `yaml:"baseKafkaConfig"`

	// ProducerKafkaConfig holds the chosen client's properties for the producer only, such as
	// "compression.type", "linger.ms" (default librdkafka.DefaultLinger, franz.DefaultLinger) or
	// "reconnect.backoff.max.ms" and "retry.backoff.ms" (defaults
	// librdkafka.DefaultReconnectBackoffMax and DefaultRetryBackoff, franz.DefaultRetryBackoff and
	// DefaultRetryBackoffMax); they override BaseKafkaConfig. Idempotence is always on and cannot
	// be disabled.
	ProducerKafkaConfig KafkaConfigMap `yaml:"producerKafkaConfig"`

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

	// DataSource is the Postgres connection string, in key=value or URL form, for the
	// harvester's own connections. Default: DefaultDataSource.
	DataSource string `yaml:"dataSource"`

	// ListenDataSource is the Postgres connection string for the one connection on which the
	// leader LISTENs for notifications of new records (see NotifyChannel). Behind a pooler in
	// transaction mode, which cannot deliver notifications, point it at Postgres directly or at
	// a session pool; without notifications the harvester polls every Limits.MaxMarkBackoff, and
	// says so once in its log. Used by the default DatabaseBindingProvider.
	// Default: DataSource.
	ListenDataSource string `yaml:"listenDataSource"`

	// OutboxTable is the outbox table, optionally schema-qualified ("app.outbox"). It is quoted
	// as written, so case matters. Default: DefaultOutboxTable.
	OutboxTable string `yaml:"outboxTable"`

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

	// DatabaseBindingProvider opens the outbox. Default: NewPostgresBinding.
	DatabaseBindingProvider DatabaseBindingProvider `yaml:"-"`

	// Kafka is the Kafka client: each epoch's producer and the leader election. Default: the
	// client KafkaClient chooses (package driver/librdkafka or driver/franz), with
	// BaseKafkaConfig and ProducerKafkaConfig; those three must be empty when Kafka is set.
	Kafka driver.Kafka `yaml:"-"`

	// MetricsRegisterer receives the harvester's Prometheus metrics (see docs/monitoring.md for the list).
	// Default: prometheus.DefaultRegisterer.
	MetricsRegisterer prometheus.Registerer `yaml:"-"`

	// TracerProvider, when set, makes the harvester record an OpenTelemetry span for each record
	// it publishes, linked to the trace in the record's traceparent header. Default: none, and
	// then tracing costs nothing.
	TracerProvider trace.TracerProvider `yaml:"-"`
}

// DatabaseBindingProvider opens a DatabaseBinding for an outbox table.
type DatabaseBindingProvider func(dataSource, outboxTable string) (driver.DatabaseBinding, error)

// Limits tunes the harvester's timing and throughput. The zero value of every field means its
// documented default.
type Limits struct {
	// IOErrorBackoff is how long to wait before retrying after a database error.
	// Default: DefaultIOErrorBackoff. Range: 1ms to 10m.
	IOErrorBackoff time.Duration `yaml:"ioErrorBackoff"`

	// PollDuration is how long one poll of the leader-election consumer may block.
	// Default: DefaultPollDuration. Range: 1ms to MinPollInterval.
	PollDuration time.Duration `yaml:"pollDuration"`

	// MinPollInterval is the shortest time between two polls of the leader-election consumer.
	// The leader sends a heartbeat on each, so several must fit within a heartbeat timeout; and
	// MaxPollInterval must be at least this. Default: DefaultMinPollInterval.
	// Range: PollDuration to below HeartbeatTimeout / 2.
	MinPollInterval time.Duration `yaml:"minPollInterval"`

	// MaxPollInterval is the longest the harvester may go without polling the leader-election
	// consumer. When leadership ends (revoked, fenced, a remark, Stop) the harvester waits up to
	// this long for the records it has in flight to be acknowledged and purged before it gives up
	// on them, and a fenced leader must be done before another can be elected; hence the bound.
	// It is also the timeout of each call to librdkafka's transactional API, which cannot be
	// cancelled; a call under way when leadership ends ends by the same deadline, so the whole
	// handover takes about this long at most.
	// Default: HeartbeatTimeout / 2. Range: MinPollInterval to HeartbeatTimeout / 2.
	MaxPollInterval time.Duration `yaml:"maxPollInterval"`

	// HeartbeatTimeout is how long a leader may go without Kafka acknowledging one of its
	// heartbeats before it assumes it has lost its partitions and fences itself. The Kafka session timeout is derived
	// from it (twice this value), so that a leader always fences itself before the group can
	// hand its partitions to another member; the broker's group.min.session.timeout.ms (6s by
	// default in Kafka) therefore requires at least 3s against a default broker.
	// Default: DefaultHeartbeatTimeout. Range: 100ms to 10m.
	HeartbeatTimeout time.Duration `yaml:"heartbeatTimeout"`

	// DrainInterval is the longest the marker waits for room in the pipeline (see
	// MaxInFlightRecords) before it looks again; a purge that makes room wakes it at once.
	// Default: the smaller of MaxPollInterval and QueueTimeout. Range: 1ms to MaxPollInterval.
	DrainInterval time.Duration `yaml:"drainInterval"`

	// QueueTimeout is how long the producer keeps trying to deliver a message before it reports
	// it failed (librdkafka's message.timeout.ms, unless ProducerKafkaConfig sets that or
	// delivery.timeout.ms). A record whose delivery fails is sent again in the next transaction.
	// The producer's transaction.timeout.ms must be at least this: unless ProducerKafkaConfig sets
	// it, it is the larger of this and librdkafka.DefaultTransactionTimeout.
	// Default: DefaultQueueTimeout. Range: DrainInterval to 1h.
	QueueTimeout time.Duration `yaml:"queueTimeout"`

	// MarkBackoff is how long to wait after a mark query that found nothing. Each further empty
	// mark doubles the wait, up to MaxMarkBackoff, so an idle outbox costs few queries.
	// Default: DefaultMarkBackoff. Range: 1ms to MaxMarkBackoff.
	MarkBackoff time.Duration `yaml:"markBackoff"`

	// MaxMarkBackoff bounds the wait between marks of an idle outbox. A notification (see
	// NotifyChannel) ends the wait at once, so this matters only when none comes: then it bounds
	// how long a record written to an idle outbox may wait to be noticed. An outbox whose
	// notifications are known to cover every write (its table has the notification trigger, and
	// its listening connection works: see driver.CoveringListener) is not polled while idle.
	// Default: DefaultMaxMarkBackoff. Range: MarkBackoff to 1m.
	MaxMarkBackoff time.Duration `yaml:"maxMarkBackoff"`

	// MaxInFlightRecords bounds the records in flight: marked by the leader and not yet purged
	// (or dropped), whether waiting for their key, with Kafka or being purged. It so bounds the
	// memory the harvester uses, whatever the backlog; Harvest.InFlightRecords and the
	// goharvest_in_flight_records gauge report the same count. The records of a key held back by
	// a record that cannot be published, from the held one on, do not count (but for the held
	// record while it is sent again), so that held keys never take the budget from the others;
	// each held key keeps in memory only its rows marked before it was held (the marker marks no
	// more). So held keys can take the count past the limit: by one per held record being sent
	// again, and for a moment when a key is released and its rows count again; the marker then
	// marks nothing until purges bring it back under. Default: DefaultMaxInFlightRecords.
	// Range: 1 to 1,000,000.
	MaxInFlightRecords int `yaml:"maxInFlightRecords"`

	// MaxKeyRun bounds how many records of one key a transaction may carry. A key's records with
	// Kafka always belong to one transaction, and its next records wait until that transaction
	// is committed and purged, so with 1 (the default) each key has one record in flight, and a
	// few busy keys get one record each per transaction. A larger value lets a transaction carry
	// a run of a key's records; such a transaction also writes a note listing them in the group
	// LeaderGroupID + NoteGroupSuffix (see NotePlace), so that a successor never publishes a run
	// again whole. Raise it only when every consumer reads with isolation.level=read_committed
	// (librdkafka's default, not the Java client's): a consumer that reads uncommitted records
	// sees an aborted run and then its retry, A B A B, where with 1 it sees only A A.
	// Default: DefaultMaxKeyRun. Range: 1 to 10,000.
	MaxKeyRun int `yaml:"maxKeyRun"`

	// SendConcurrency is the number of send workers; records are sharded over them by key.
	// Default: DefaultSendConcurrency. Range: 1 to 1024.
	SendConcurrency int `yaml:"sendConcurrency"`

	// SendBuffer is the capacity of each send worker's queue of marked records.
	// Default: DefaultSendBuffer. Range: 1 to 100,000.
	SendBuffer int `yaml:"sendBuffer"`

	// MarkQueryRecords is the most records one mark query may return.
	// Default: DefaultMarkQueryRecords. Range: 1 to 100,000.
	MarkQueryRecords int `yaml:"markQueryRecords"`

	// MinMetricsInterval is the shortest time between two throughput readings (MeterRead events).
	// Default: DefaultMinMetricsInterval. Range: 1ms to 1h.
	MinMetricsInterval time.Duration `yaml:"minMetricsInterval"`

	// BacklogSampleInterval is how often the leader counts the outbox's backlog and the age of its
	// oldest record, for the metrics. Default: DefaultBacklogSampleInterval. Range: 100ms to 1h.
	BacklogSampleInterval time.Duration `yaml:"backlogSampleInterval"`

	// HeldCheckInterval is how often the leader reads the rows of held records afresh (one query
	// for all of them), so that an operator's fix or delete takes effect within about this long. A
	// held record whose backoff is over is also read at once before it is sent again.
	// Default: DefaultHeldCheckInterval. Range: 10ms to 1m.
	HeldCheckInterval time.Duration `yaml:"heldCheckInterval"`

	// DeadLetterAttempts, when not 0, is how many failed attempts a held record may have before
	// its row is moved into the dead-letter table (see DeadLetterTable) and its key released.
	// Default: 0, no dead letters. Range: 0 to 1,000,000.
	DeadLetterAttempts int `yaml:"deadLetterAttempts"`

	// DeadLetterAfter, when not 0, is how long a record may be held, from its first failure,
	// before its row is moved into the dead-letter table and its key released.
	// Default: 0, no dead letters. Range: 0, or 1s to 8760h.
	DeadLetterAfter time.Duration `yaml:"deadLetterAfter"`

	// AwaitStandbys, when not 0, is how many standbys must hold (have flushed, as
	// pg_stat_replication shows) a mark before its records are sent, and a purge before the next
	// records of its keys are: so that a standby promoted after its primary failed, under
	// asynchronous replication, republishes no record after a later one of its key, and holds
	// every row that was published. While fewer standbys hold them, publishing waits, and Ready
	// says why. The role needs pg_monitor. Default: 0, no wait. Range: 0 to 64.
	AwaitStandbys int `yaml:"awaitStandbys"`
}

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

// WithDefaults returns a copy of c in which every zero field holds its default. The Kafka maps
// are copied, so the result shares nothing mutable with c. When LeaderGroupID or LeaderTopic is
// defaulted, a warning is logged through the (possibly defaulted) Logger.
func (c Config) WithDefaults() Config {
	c.BaseKafkaConfig = maps.Clone(c.BaseKafkaConfig)
	c.ProducerKafkaConfig = maps.Clone(c.ProducerKafkaConfig)
	if c.Kafka == nil {
		if c.KafkaClient == "" {
			c.KafkaClient = DefaultKafkaClient()
		}
		if c.BaseKafkaConfig == nil {
			c.BaseKafkaConfig = KafkaConfigMap{}
		}
		if _, ok := c.BaseKafkaConfig["bootstrap.servers"]; !ok {
			c.BaseKafkaConfig["bootstrap.servers"] = DefaultBootstrapServers
		}
		if c.ProducerKafkaConfig == nil {
			c.ProducerKafkaConfig = KafkaConfigMap{}
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.DatabaseBindingProvider == nil {
		c.DatabaseBindingProvider = StandardPostgresBindingProvider(postgres.WithListenDataSource(c.ListenDataSource))
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
	if c.DataSource == "" {
		c.DataSource = DefaultDataSource
	}
	if c.ListenDataSource == "" {
		c.ListenDataSource = c.DataSource
	}
	if c.OutboxTable == "" {
		c.OutboxTable = DefaultOutboxTable
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

// WithDefaults returns a copy of l in which every zero field holds its default.
func (l Limits) WithDefaults() Limits { return Limits(epoch.Limits(l).WithDefaults()) }

// election returns the durations l shares with package neli, whose defaults and ranges package
// timing holds.
func (l Limits) election() timing.Election {
	return timing.Election{HeartbeatTimeout: l.HeartbeatTimeout, PollDuration: l.PollDuration, MinPollInterval: l.MinPollInterval}
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

// Validate checks a Config whose defaults have been applied (see WithDefaults). It reports
// every problem, each naming the field (with its YAML key) and what is allowed.
func (c Config) Validate() error {
	var errs []error
	bad := func(field, yamlKey, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s (%s): %s", field, yamlKey, fmt.Sprintf(format, args...)))
	}

	errs = append(errs, c.kafkaProblems()...)
	checkTopicLike := func(field, yamlKey, value string) {
		if err := outbox.CheckName(value); err != nil {
			bad(field, yamlKey, "%q: %v", value, err)
		}
	}
	checkTopicLike("LeaderTopic", "leaderTopic", c.LeaderTopic)
	checkTopicLike("LeaderGroupID", "leaderGroupID", c.LeaderGroupID)

	if _, err := pgxpool.ParseConfig(c.DataSource); err != nil {
		bad("DataSource", "dataSource", "%v", err)
	}
	if _, err := pgxpool.ParseConfig(c.ListenDataSource); err != nil {
		bad("ListenDataSource", "listenDataSource", "%v", err)
	}
	if _, err := pgname.QuoteTable(c.OutboxTable); err != nil {
		bad("OutboxTable", "outboxTable", "%v", err)
	}
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
	if c.DatabaseBindingProvider == nil {
		bad("DatabaseBindingProvider", "-", "must not be nil")
	}
	errs = append(errs, c.Limits.validate()...)
	if len(errs) > 0 {
		return fmt.Errorf("invalid harvest config: %w", errors.Join(errs...))
	}
	return nil
}

// validate checks each limit against its range; the ranges of the polling and draining limits
// depend on each other, as their comments explain.
func (l Limits) validate() []error {
	var errs []error
	between := func(field, yamlKey string, v, lo, hi time.Duration, why string) {
		if v < lo || v > hi {
			msg := fmt.Sprintf("%v is out of range [%v, %v]", v, lo, hi)
			if why != "" {
				msg += ": " + why
			}
			errs = append(errs, fmt.Errorf("Limits.%s (limits.%s): %s", field, yamlKey, msg))
		}
	}
	betweenInt := func(field, yamlKey string, v, lo, hi int) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Errorf("Limits.%s (limits.%s): %d is out of range [%d, %d]", field, yamlKey, v, lo, hi))
		}
	}
	between("IOErrorBackoff", "ioErrorBackoff", l.IOErrorBackoff, time.Millisecond, 10*time.Minute, "")
	for _, p := range l.election().Problems() {
		errs = append(errs, fmt.Errorf("Limits.%s (limits.%s): %v is %s", p.Field, lowerFirst(p.Field), p.Value, p.Reason))
	}
	// A leader that loses leadership waits up to MaxPollInterval for its in-flight records; a
	// fenced one must be done before the group can elect another, which takes at least 1.9
	// heartbeat timeouts (see package neli), so half a timeout leaves a safe margin.
	between("MaxPollInterval", "maxPollInterval", l.MaxPollInterval, l.MinPollInterval, l.HeartbeatTimeout/2,
		"must be at least minPollInterval and at most half of heartbeatTimeout, so that a fenced leader has finished before another can be elected")
	// A wait for a drain must end in time for the next poll.
	between("DrainInterval", "drainInterval", l.DrainInterval, time.Millisecond, l.MaxPollInterval,
		"a single wait for in-flight records must end in time for the next poll (maxPollInterval)")
	between("QueueTimeout", "queueTimeout", l.QueueTimeout, l.DrainInterval, time.Hour,
		"must be at least drainInterval")
	between("MarkBackoff", "markBackoff", l.MarkBackoff, time.Millisecond, l.MaxMarkBackoff, "must not exceed maxMarkBackoff")
	between("MaxMarkBackoff", "maxMarkBackoff", l.MaxMarkBackoff, time.Millisecond, time.Minute, "")
	between("MinMetricsInterval", "minMetricsInterval", l.MinMetricsInterval, time.Millisecond, time.Hour, "")
	between("BacklogSampleInterval", "backlogSampleInterval", l.BacklogSampleInterval, 100*time.Millisecond, time.Hour, "")
	betweenInt("MaxInFlightRecords", "maxInFlightRecords", l.MaxInFlightRecords, 1, 1_000_000)
	betweenInt("MaxKeyRun", "maxKeyRun", l.MaxKeyRun, 1, 10_000)
	betweenInt("SendConcurrency", "sendConcurrency", l.SendConcurrency, 1, 1024)
	betweenInt("SendBuffer", "sendBuffer", l.SendBuffer, 1, 100_000)
	betweenInt("MarkQueryRecords", "markQueryRecords", l.MarkQueryRecords, 1, 100_000)
	between("HeldCheckInterval", "heldCheckInterval", l.HeldCheckInterval, 10*time.Millisecond, time.Minute, "")
	betweenInt("DeadLetterAttempts", "deadLetterAttempts", l.DeadLetterAttempts, 0, 1_000_000)
	betweenInt("AwaitStandbys", "awaitStandbys", l.AwaitStandbys, 0, 64)
	// 0 turns dead letters off; a shorter wait than a second would dead-letter records before an
	// operator or a retry could do anything.
	if l.DeadLetterAfter != 0 {
		between("DeadLetterAfter", "deadLetterAfter", l.DeadLetterAfter, time.Second, 8760*time.Hour, "or 0 for no dead letters")
	}
	return errs
}

// lowerFirst turns a Limits field's name into its YAML key.
func lowerFirst(field string) string {
	return strings.ToLower(field[:1]) + field[1:]
}
