package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/driver/mysql"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/outbox"
)

// Settings is what harvest: configures, and each entry of outboxes:: the harvester's settings
// (goharvest.Config's keys) and its drivers': the outbox (database, dataSource,
// listenDataSource, outboxTable) and the Kafka client (kafkaClient, baseKafkaConfig,
// producerKafkaConfig). The reaper makes the drivers from them, here, the one place that
// chooses a store and a client by name and reads the property maps.
type Settings struct {
	goharvest.Config `yaml:",inline"`

	// Database is the kind of database the outbox is in, which chooses the store the reaper
	// makes: DatabasePostgres (the default) or DatabaseMySQL (MySQL or MariaDB).
	Database Database `yaml:"database"`

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
	// "reconnect.backoff.max.ms", "retry.backoff.ms" and "retry.backoff.max.ms" (defaults
	// librdkafka.DefaultReconnectBackoffMax, DefaultRetryBackoff and DefaultRetryBackoffMax,
	// franz.DefaultRetryBackoff and DefaultRetryBackoffMax); they override BaseKafkaConfig.
	// Idempotence is always on and cannot be disabled.
	ProducerKafkaConfig KafkaConfigMap `yaml:"producerKafkaConfig"`

	// DataSource is where the harvester's own connections go. For Postgres, a connection
	// string in key=value or URL form; default postgres.DefaultDataSource. For MySQL,
	// go-sql-driver's data source, "user:password@tcp(host:3306)/database", which has no
	// default; the store needs none of its parameters (it reads times as numbers, so parseTime
	// does not matter, and interpolates parameters unless the data source says otherwise), but
	// autocommit must stay on.
	DataSource string `yaml:"dataSource"`

	// ListenDataSource is the Postgres connection string for the one connection on which the
	// leader LISTENs for notifications of new records (see outbox.NotifyChannel). Behind a
	// pooler in transaction mode, which cannot deliver notifications, point it at Postgres
	// directly or at a session pool; without notifications the harvester polls every
	// limits.maxMarkBackoff, and says so once in its log. Default: DataSource. MySQL has no
	// LISTEN: a MySQL outbox refuses it.
	ListenDataSource string `yaml:"listenDataSource"`

	// OutboxTable is the outbox table, optionally qualified by its schema (Postgres,
	// "app.outbox") or its database (MySQL, "shop.outbox"). It is quoted as written, so case
	// matters. Default: outbox.DefaultTable.
	OutboxTable string `yaml:"outboxTable"`
}

// Database names the kind of database an outbox is in. Validate refuses any value but the
// constants below.
type Database string

// The databases.
const (
	// DatabasePostgres is package driver/postgres, on pgx: the default, so a file written before
	// database: existed keeps its meaning.
	DatabasePostgres Database = "postgres"
	// DatabaseMySQL is package driver/mysql, on go-sql-driver/mysql: MySQL 8.0 or MariaDB 10.6
	// at least, InnoDB. It has no notifications, so the harvester polls (see
	// DefaultMySQLMaxMarkBackoff).
	DatabaseMySQL Database = "mysql"
	// DefaultDatabase is database's default.
	DefaultDatabase = DatabasePostgres
)

// DefaultMySQLMaxMarkBackoff is limits.maxMarkBackoff's default for a MySQL outbox, where no
// notification ends the marker's wait: a record written to an idle outbox waits at most this
// long to be noticed, rather than the engine's second (epoch.DefaultMaxMarkBackoff), for ten
// reads a second of the head of an empty table (per shard led). A Postgres outbox keeps the
// engine's default.
const DefaultMySQLMaxMarkBackoff = 100 * time.Millisecond

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
	if s.Database == "" {
		s.Database = DefaultDatabase
	}
	s.Config = s.ownConfig().WithDefaults()
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
	if s.Database == DatabasePostgres {
		if s.DataSource == "" {
			s.DataSource = postgres.DefaultDataSource
		}
		if s.ListenDataSource == "" {
			s.ListenDataSource = s.DataSource
		}
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
	switch s.Database {
	case DatabasePostgres:
		if _, err := pgxpool.ParseConfig(s.DataSource); err != nil {
			bad("DataSource", "dataSource", err)
		}
		if _, err := pgxpool.ParseConfig(s.ListenDataSource); err != nil {
			bad("ListenDataSource", "listenDataSource", err)
		}
		if _, err := outbox.QuoteTable(s.OutboxTable); err != nil {
			bad("OutboxTable", "outboxTable", err)
		}
	case DatabaseMySQL:
		s.checkMySQL(bad)
	default:
		bad("Database", "database", fmt.Errorf("%q: must be %q or %q", s.Database, DatabasePostgres, DatabaseMySQL))
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
	store, err := d.store()
	if err != nil {
		return goharvest.Config{}, fmt.Errorf("outbox %s: %w", d.OutboxTable, err)
	}
	c := s.ownConfig()
	c.Store, c.Kafka = store, kafka
	return c, nil
}

// ownConfig is the harvester's settings as written, but for the defaults that depend on the
// database: an outbox without notifications (MySQL) is polled every
// DefaultMySQLMaxMarkBackoff at most unless limits.maxMarkBackoff says otherwise, and never
// more often than limits.markBackoff allows.
func (s Settings) ownConfig() goharvest.Config {
	c := s.Config
	if s.Database == DatabaseMySQL && c.Limits.MaxMarkBackoff == 0 {
		c.Limits.MaxMarkBackoff = max(DefaultMySQLMaxMarkBackoff, c.Limits.MarkBackoff)
	}
	return c
}

// store makes the store Database names, from settings whose defaults have been applied and
// that Validate accepts. It connects lazily.
func (s Settings) store() (driver.Store, error) {
	if s.Database == DatabaseMySQL {
		return mysql.New(s.DataSource, s.OutboxTable)
	}
	var opts []postgres.Option
	if s.ListenDataSource != s.DataSource {
		// Only a listening connection that goes another way is set apart: one that goes the
		// pool's way answers the readiness probes of an idle outbox, which then holds one
		// connection rather than two (see postgres.Store.Ping).
		opts = append(opts, postgres.WithListenDataSource(s.ListenDataSource))
	}
	return postgres.New(s.DataSource, s.OutboxTable, opts...)
}

// createTable creates the outbox table and its dead-letter table where they are missing, with
// the Postgres store's options (bytea payload columns, the index of shards); it returns what it
// made besides the two tables, for reaper init to say.
func (s Settings) createTable(ctx context.Context, bytea bool) (extra string, err error) {
	if s.Database == DatabaseMySQL {
		if bytea {
			return "", errors.New("-bytea applies to Postgres outboxes: a MySQL outbox's key and value columns are binary already (VARBINARY, MEDIUMBLOB), its header values JSON text")
		}
		if s.Shards > 1 {
			extra = fmt.Sprintf("no index for %d shards: MySQL has none yet, each shard's claim walks the primary key", s.Shards)
		}
		return extra, mysql.CreateOutboxTable(ctx, s.DataSource, s.OutboxTable)
	}
	if s.Shards > 1 {
		extra = fmt.Sprintf("and the index for %d shards", s.Shards)
	}
	return extra, postgres.CreateOutboxTable(ctx, s.DataSource, s.OutboxTable, outbox.TableOptions{Bytea: bytea, Shards: s.Shards})
}

// deadLetterNow moves outbox record id into the dead-letter table at once (reaper dead-letter).
func (s Settings) deadLetterNow(ctx context.Context, id int64, reason string) error {
	if s.Database == DatabaseMySQL {
		return mysql.DeadLetterNow(ctx, s.DataSource, s.OutboxTable, id, reason)
	}
	return postgres.DeadLetterNow(ctx, s.DataSource, s.OutboxTable, id, reason)
}

// requeue moves dead letter id back into the outbox, at its tail, and returns its new id
// (reaper requeue).
func (s Settings) requeue(ctx context.Context, id int64) (int64, error) {
	if s.Database == DatabaseMySQL {
		return mysql.Requeue(ctx, s.DataSource, s.OutboxTable, id)
	}
	return postgres.Requeue(ctx, s.DataSource, s.OutboxTable, id)
}

// mysqlDataSourceForm is what a MySQL outbox's dataSource looks like, for errors.
const mysqlDataSourceForm = "a go-sql-driver data source, user:password@tcp(host:3306)/database"

// checkMySQL reports through bad what a MySQL outbox's settings have wrong.
func (s Settings) checkMySQL(bad func(field, yamlKey string, err error)) {
	if s.ListenDataSource != "" {
		bad("ListenDataSource", "listenDataSource", errors.New("MySQL has no LISTEN, so a MySQL outbox has no listening connection: "+
			"remove it (from harvest: too, or set it to \"\" in this outbox); the harvester polls, every limits.maxMarkBackoff at most"))
	}
	if s.DataSource == "" {
		bad("DataSource", "dataSource", errors.New("required for database: mysql: "+mysqlDataSourceForm))
	} else if cfg, err := gomysql.ParseDSN(s.DataSource); err != nil {
		bad("DataSource", "dataSource", fmt.Errorf("%w; want %s", err, mysqlDataSourceForm))
	} else {
		if _, table := mysqlTable(cfg, s.OutboxTable); cfg.DBName == "" && table == s.OutboxTable {
			bad("DataSource", "dataSource", fmt.Errorf("names no database, and outboxTable %q is not qualified by one: "+
				"end the data source with /database, or write outboxTable as database.table", s.OutboxTable))
		}
		if v, ok := cfg.Params["autocommit"]; ok && !isOn(v) {
			bad("DataSource", "dataSource", fmt.Errorf("autocommit=%s: autocommit must stay on, or a session keeps the snapshot of its "+
				"first read and never sees a newer row; remove the parameter", v))
		}
	}
	if _, err := outbox.QuoteTableMySQL(s.OutboxTable); err != nil {
		bad("OutboxTable", "outboxTable", err)
	}
	if s.Limits.AwaitStandbys != 0 {
		// The MySQL store cannot tell how far replicas have come; the harvester would not wait.
		bad("Limits.AwaitStandbys", "limits.awaitStandbys", errors.New("waiting for standbys is for Postgres outboxes: a MySQL outbox cannot wait for its replicas; set 0 or remove it"))
	}
}

// isOn says whether a MySQL system variable's value in a data source turns it on.
func isOn(v string) bool {
	switch strings.ToLower(strings.Trim(v, "'\"")) {
	case "1", "on", "true":
		return true
	}
	return false
}

// mysqlTable returns the database and table a MySQL outbox's table name means on connections
// of cfg.
func mysqlTable(cfg *gomysql.Config, outboxTable string) (database, table string) {
	if db, t, ok := strings.Cut(outboxTable, "."); ok {
		return db, t
	}
	return cfg.DBName, outboxTable
}

// tableIdentity names the outbox table as its server sees it (settings whose defaults have been
// applied), so that two data sources written differently for one database still count as one:
// the kind of database, its server, the database and the table, whose Postgres schema is
// public unless it says otherwise (the default search_path's).
func (s Settings) tableIdentity() string {
	if s.Database == DatabaseMySQL {
		cfg, err := gomysql.ParseDSN(s.DataSource)
		if err != nil {
			// Validate reports the data source; compare it as written meanwhile.
			return fmt.Sprintf("%s in MySQL database %q", s.OutboxTable, s.DataSource)
		}
		db, table := mysqlTable(cfg, s.OutboxTable)
		return fmt.Sprintf("%s.%s in MySQL on %s", db, table, cfg.Addr)
	}
	table := s.OutboxTable
	if !strings.Contains(table, ".") {
		table = "public." + table
	}
	cfg, err := pgconn.ParseConfig(s.DataSource)
	if err != nil {
		return fmt.Sprintf("%s in database %q", table, s.DataSource)
	}
	return fmt.Sprintf("%s in database %s on %s:%d", table, cfg.Database, cfg.Host, cfg.Port)
}

// describeDataSource says where a data source of the outbox's database points (user, server,
// database), leaving out its password and every other parameter.
func (s Settings) describeDataSource(dataSource string) string {
	const unparsed = "(set; not shown, as it does not parse)"
	if s.Database == DatabaseMySQL {
		cfg, err := gomysql.ParseDSN(dataSource)
		if err != nil {
			return unparsed
		}
		return fmt.Sprintf("MySQL: user %s, address %s, database %s", cfg.User, cfg.Addr, cfg.DBName)
	}
	cfg, err := pgconn.ParseConfig(dataSource)
	if err != nil {
		return unparsed
	}
	return fmt.Sprintf("user %s, host %s, port %d, database %s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
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
