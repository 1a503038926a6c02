package reaper

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/outbox"
)

// Settings is what harvest: configures, and each entry of outboxes:: the harvester's settings
// (goharvest.Config's keys) and its drivers': the Postgres outbox (dataSource,
// listenDataSource, outboxTable) and the Kafka client (kafkaClient, baseKafkaConfig,
// producerKafkaConfig). The reaper makes the drivers from them, in driver, the one place that
// chooses a client by name and reads the property maps.
type Settings struct {
	goharvest.Config `yaml:",inline"`

	// KafkaClient chooses the Kafka client that the harvester makes from BaseKafkaConfig and
	// ProducerKafkaConfig: KafkaClientFranz (the default) or KafkaClientLibrdkafka.
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

	// DataSource is the Postgres connection string, in key=value or URL form, for the
	// harvester's own connections. Default: postgres.DefaultDataSource.
	DataSource string `yaml:"dataSource"`

	// ListenDataSource is the Postgres connection string for the one connection on which the
	// leader LISTENs for notifications of new records (see outbox.NotifyChannel). Behind a
	// pooler in transaction mode, which cannot deliver notifications, point it at Postgres
	// directly or at a session pool; without notifications the harvester polls every
	// limits.maxMarkBackoff, and says so once in its log. Default: DataSource.
	ListenDataSource string `yaml:"listenDataSource"`

	// OutboxTable is the outbox table, optionally schema-qualified ("app.outbox"). It is quoted
	// as written, so case matters. Default: outbox.DefaultTable.
	OutboxTable string `yaml:"outboxTable"`
}

// KafkaConfigMap holds Kafka client properties, as librdkafka names them, such as
// "bootstrap.servers" or "compression.type". Values are strings, booleans or numbers, as YAML
// gives them.
type KafkaConfigMap map[string]any

// KafkaClient names a Kafka client that the reaper makes from the property maps. Validate
// refuses any value but the constants below, and KafkaClientLibrdkafka in a build without cgo.
type KafkaClient string

// The Kafka clients.
const (
	// KafkaClientFranz is package driver/franz: franz-go, in pure Go, configured by the
	// properties franz.FromProperties maps, which refuses the others, with an election of its
	// own on kgo's group client. The default: it measured better than librdkafka on every
	// benchmark but one on a one-node cluster and level on three (docs/performance.md), needs no
	// cgo, and passes the same fault suite and soaks.
	KafkaClientFranz KafkaClient = "franz"
	// KafkaClientLibrdkafka is package driver/librdkafka: librdkafka through confluent-kafka-go,
	// with package neli's election. It needs cgo, so a build without cgo does not have it.
	KafkaClientLibrdkafka KafkaClient = "librdkafka"
	// DefaultKafkaClient is kafkaClient's default.
	DefaultKafkaClient = KafkaClientFranz
)

// DefaultBootstrapServers is used when baseKafkaConfig has no "bootstrap.servers".
const DefaultBootstrapServers = "localhost:9092"

// WithDefaults returns a copy of s in which every zero field holds its default, the harvester's
// (goharvest.Config.WithDefaults, which logs what it defaults) and the drivers'. The Kafka maps
// are copied, so the result shares nothing mutable with s.
func (s Settings) WithDefaults() Settings {
	s.Config = s.Config.WithDefaults()
	if s.KafkaClient == "" {
		s.KafkaClient = DefaultKafkaClient
	}
	s.BaseKafkaConfig = maps.Clone(s.BaseKafkaConfig)
	if s.BaseKafkaConfig == nil {
		s.BaseKafkaConfig = KafkaConfigMap{}
	}
	if _, ok := s.BaseKafkaConfig["bootstrap.servers"]; !ok {
		s.BaseKafkaConfig["bootstrap.servers"] = DefaultBootstrapServers
	}
	s.ProducerKafkaConfig = maps.Clone(s.ProducerKafkaConfig)
	if s.ProducerKafkaConfig == nil {
		s.ProducerKafkaConfig = KafkaConfigMap{}
	}
	if s.DataSource == "" {
		s.DataSource = postgres.DefaultDataSource
	}
	if s.ListenDataSource == "" {
		s.ListenDataSource = s.DataSource
	}
	if s.OutboxTable == "" {
		s.OutboxTable = outbox.DefaultTable
	}
	return s
}

// Validate checks settings whose defaults have been applied: the harvester's
// (goharvest.Config.Validate) and the drivers'. It reports every problem, each naming the field
// and its YAML key.
func (s Settings) Validate() error {
	_, err := s.check()
	return err
}

// check is Validate, and returns the Kafka client made from the property maps, which it reads
// once (reading any file a property names).
func (s Settings) check() (driver.Kafka, error) {
	var errs []error
	if err := s.Config.Validate(); err != nil {
		errs = append(errs, errors.Unwrap(err)) // without its "invalid harvest config: ", said below
	}
	kafka, problems := s.kafka()
	errs = append(errs, problems...)
	bad := func(field, yamlKey string, err error) {
		errs = append(errs, fmt.Errorf("%s (%s): %w", field, yamlKey, err))
	}
	if _, err := pgxpool.ParseConfig(s.DataSource); err != nil {
		bad("DataSource", "dataSource", err)
	}
	if _, err := pgxpool.ParseConfig(s.ListenDataSource); err != nil {
		bad("ListenDataSource", "listenDataSource", err)
	}
	if _, err := outbox.QuoteTable(s.OutboxTable); err != nil {
		bad("OutboxTable", "outboxTable", err)
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("invalid harvest config: %w", errors.Join(errs...))
	}
	return kafka, nil
}

// HarvestConfig checks the settings (with defaults applied: see Validate) and returns the
// harvester's goharvest.Config: s's own settings as written, for goharvest.New to apply their
// defaults and log what it defaults, with the drivers made from s: the Kafka client, which
// contacts no broker until used, and the Postgres store, which connects lazily. The caller
// disposes of its Store if no harvester is started with it.
func (s Settings) HarvestConfig() (goharvest.Config, error) {
	quiet := s
	quiet.Logger = slog.New(slog.DiscardHandler)
	d := quiet.WithDefaults()
	kafka, err := d.check()
	if err != nil {
		return goharvest.Config{}, err
	}
	var opts []postgres.Option
	if d.ListenDataSource != d.DataSource {
		// Only a listening connection that goes another way is set apart: one that goes the
		// pool's way answers the readiness probes of an idle outbox, which then holds one
		// connection rather than two (see postgres.Store.Ping).
		opts = append(opts, postgres.WithListenDataSource(d.ListenDataSource))
	}
	store, err := postgres.New(d.DataSource, d.OutboxTable, opts...)
	if err != nil {
		return goharvest.Config{}, fmt.Errorf("outbox %s: %w", d.OutboxTable, err)
	}
	c := s.Config
	c.Store, c.Kafka = store, kafka
	return c, nil
}

// kafka makes the Kafka client KafkaClient names from the property maps, read once, and returns
// the properties it refuses, each naming its field and key.
func (s Settings) kafka() (driver.Kafka, []error) {
	switch s.KafkaClient {
	case KafkaClientFranz:
		cfg, problems := franz.FromProperties(s.BaseKafkaConfig, s.ProducerKafkaConfig, s.Limits.QueueTimeout)
		var errs []error
		for _, p := range problems {
			errs = append(errs, propertyProblem(p.Producer, p.Property, p.Reason))
		}
		return franz.New(cfg), errs
	case KafkaClientLibrdkafka:
		return librdkafkaClient(s)
	}
	return nil, []error{fmt.Errorf("KafkaClient (kafkaClient): %q: must be %q or %q", s.KafkaClient, KafkaClientLibrdkafka, KafkaClientFranz)}
}

// propertyProblem is a client's refusal of a Kafka property, naming the field and YAML key that
// hold it.
func propertyProblem(producer bool, property, reason string) error {
	field, key := "BaseKafkaConfig", "baseKafkaConfig"
	if producer {
		field, key = "ProducerKafkaConfig", "producerKafkaConfig"
	}
	return fmt.Errorf("%s (%s.%s): %s", field, key, property, reason)
}
