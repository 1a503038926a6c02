package postgres

import (
	"cmp"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/outbox"
)

// Store is the DatabaseBinding for PostgreSQL, on a pgx connection pool.
type Store struct {
	pool   *pgxpool.Pool
	listen *pgx.ConnConfig // for the listening connection, which is not the pool's
	probe  time.Duration   // how long Listen waits for its test notification
	// answered is when an idle listening connection last answered a check (unix nanoseconds),
	// 0 when none listens or it has heard a notification since; nil when it does not go the
	// pool's way (WithListenDataSource), and so cannot answer for it. Shared by the shards'
	// views. See Ping.
	answered *atomic.Int64
	hub      *listenHub // the listening connection, shared by the shards' views
	channel  string
	table    string // quoted
	markSQL  string
	readSQL  string
	purgeSQL string
	resetSQL string
	held     heldSQL
	// shard is the condition that limits a shard's view (see Shard) to its rows, "" for the whole
	// table. A view shares its parent's pool, which only the parent disposes.
	shard      string
	shardOrder string // the order that walks the shard index, "id" for the whole table
	ownsPool   bool   // New made the pool, so Dispose closes it; NewWithPool's is the caller's
}

// markStatement marks the oldest records not marked by this leader, of the rows where holds,
// which pickStatement picks; RETURNING gives the rows in no particular order, so Mark sorts them.
func markStatement(table, where, orderBy string) string {
	return `UPDATE ` + table + ` SET leader_id = $1
WHERE id IN (
  ` + pickStatement(table, where, orderBy) + `
)
RETURNING ` + outboxSelect
}

// pickStatement is markStatement's subquery. It walks the primary key from the head of the table
// (or, for a shard, the shard index from the head of the shard: see outbox.ShardMarkClauses for
// why its order is spelt out).
func pickStatement(table, where, orderBy string) string {
	return `SELECT id FROM ` + table + `
  WHERE (leader_id IS NULL OR leader_id <> $1)` + where + `
  ORDER BY ` + orderBy + `
  LIMIT $2`
}

// readStatement reads, without changing them, the oldest rows where holds, leaving out the ids
// in $1 and the keys in $2 (see Read): a walk of the primary key, or of a shard's index, from the
// head of the table. The ids are a subquery so that Postgres hashes them once per read: the
// statement is prepared, and in its generic plan "id <> ALL($1)" compares every row walked with
// every id in flight (thousands), which cost ten times the CPU of the whole read.
func readStatement(table, where, orderBy string) string {
	return `SELECT ` + outboxSelect + ` FROM ` + table + `
  WHERE id NOT IN (SELECT unnest($1::bigint[])) AND kafka_key <> ALL($2)` + where + `
  ORDER BY ` + orderBy + `
  LIMIT $3`
}

// Read implements driver.Reader with one SELECT: it writes nothing.
func (b *Store) Read(ctx context.Context, limit int, heldKeys []string, exclude []int64) ([]driver.MarkedRecord, error) {
	// As bytes, so that the comparison holds for a bytea kafka_key too (see MarkExcept).
	keys := make([][]byte, len(heldKeys))
	for i, k := range heldKeys {
		keys[i] = []byte(k)
	}
	if exclude == nil {
		exclude = []int64{} // an empty array, not NULL: <> ALL of NULL is never true
	}
	return b.claim(ctx, "read outbox", b.readSQL, limit, exclude, keys, limit)
}

// Shard returns a view of the binding that marks only the rows of one shard of shards (see
// Config.Shards); purges, resets and re-reads work by id and are the same. The view's Dispose
// does nothing: the binding's pool is shared.
func (b *Store) Shard(shard, shards int) driver.DatabaseBinding {
	v := *b
	where, orderBy := outbox.ShardMarkClauses(shards, shard)
	v.shard, v.shardOrder = " AND "+where, orderBy
	v.markSQL = markStatement(b.table, v.shard, orderBy)
	v.readSQL = readStatement(b.table, v.shard, orderBy)
	v.held.markExcept = markStatement(b.table, v.shard+` AND kafka_key <> ALL($3)`, orderBy)
	return &v
}

// outboxSelect lists the columns the harvester reads, in scanRecord's order.
const outboxSelect = `id, create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values, leader_id`

// outboxColumns are the columns the harvester reads, with the types it can read them as.
var outboxColumns = []driver.Column{
	{Name: "id", Types: []string{"bigint", "integer"}},
	{Name: "create_time", Types: []string{"timestamp with time zone", "timestamp without time zone"}},
	{Name: "kafka_topic", Types: []string{"text", "character varying", "character"}},
	{Name: "kafka_key", Types: []string{"text", "character varying", "character", "bytea"}},
	{Name: "kafka_value", Types: []string{"text", "character varying", "character", "bytea", "json", "jsonb"}},
	{Name: "kafka_header_keys", Types: []string{"text[]", "character varying[]"}},
	{Name: "kafka_header_values", Types: []string{"text[]", "character varying[]", "bytea[]"}},
	{Name: "leader_id", Types: []string{"uuid"}},
}

// CheckSchema checks that the outbox table has every column the harvester reads, of a type it
// can read. A mismatch is a *SchemaError naming each column; other errors (the database being
// unreachable) are returned as they are.
func (b *Store) CheckSchema(ctx context.Context) error {
	rows, err := b.pool.Query(ctx, `SELECT a.attname, format_type(a.atttypid, NULL)
		FROM pg_attribute a WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped`, b.table)
	if err != nil {
		return fmt.Errorf("check outbox table: %w", err)
	}
	types, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) ([2]string, error) {
		var col [2]string
		err := row.Scan(&col[0], &col[1])
		return col, err
	})
	if err != nil {
		return fmt.Errorf("check outbox table: %w", err)
	}
	have := map[string]string{}
	for _, t := range types {
		have[t[0]] = t[1]
	}
	return driver.CheckColumns(b.table, have, outboxColumns)
}

var _ driver.DatabaseBinding = (*Store)(nil)

// execMode is how the binding's pool sends statements. pgx's default caches a named
// prepared statement per query on each connection, which breaks behind a pooler that hands out
// server connections per transaction (the name exists on one server and not another, or twice), and
// lets Postgres settle on a generic plan after five executions, which it then keeps: for the mark,
// a plan made for no particular leader ID and limit, perhaps while the table was small, whose cost
// then grows with the table (the MarkLatency benchmark's "generic" case). This mode sends every
// statement as the unnamed statement, parsed again in the same round trip as its execution (pgx
// caches only the parameter and column types, on the client), so there is no server-side state to
// lose between transactions, and Postgres plans each execution for its actual values: an unnamed
// statement is always within its first custom plans. Nothing needs setting on the session, which a
// transaction pooler would not keep either. (Even a generic plan forced with
// plan_cache_mode=force_generic_plan is then made afresh at each execution.)
//
// A data source that names its own default_query_exec_mode keeps it: cache_statement, on a
// direct connection, is how the MarkLatency benchmark shows the generic plan this avoids.
const execMode = pgx.QueryExecModeCacheDescribe

// execModeSet matches a data source, key=value or URL, that sets default_query_exec_mode.
var execModeSet = regexp.MustCompile(`(^|[\s?&])default_query_exec_mode\s*=`)

// The pool's idle connections are closed after DefaultPoolMaxConnIdleTime unused (pgxpool's
// default: 30 minutes), looked for every DefaultPoolHealthCheckPeriod (pgxpool's: a minute),
// unless the data source sets pool_max_conn_idle_time or pool_health_check_period. An idle
// outbox makes no queries while its notifications are covered (see ListenCovering), and so holds
// only its listening connection; the cost is a new connection for the first statement after a
// pause longer than this.
const (
	DefaultPoolMaxConnIdleTime   = 10 * time.Second
	DefaultPoolHealthCheckPeriod = 5 * time.Second
)

// poolIdleSet and poolHealthSet match a data source that sets the pool's idle time or its health
// check period.
var (
	poolIdleSet   = regexp.MustCompile(`(^|[\s?&])pool_max_conn_idle_time\s*=`)
	poolHealthSet = regexp.MustCompile(`(^|[\s?&])pool_health_check_period\s*=`)
)

// Option adjusts a Store (see New).
type Option func(*options)

type options struct {
	listenDataSource string
	probe            time.Duration
}

// WithListenDataSource has the binding LISTEN for notifications through its own connection
// string rather than the pool's: behind a pooler that hands out a server connection per
// transaction, a LISTEN is forgotten as soon as its statement ends, so point this at Postgres
// directly or at a session pool. Empty means the main data source.
func WithListenDataSource(dataSource string) Option {
	return func(o *options) { o.listenDataSource = dataSource }
}

// DefaultNotificationProbeTimeout is how long Listen waits for the test notification it sends
// itself before it concludes that notifications cannot reach its connection.
const DefaultNotificationProbeTimeout = 5 * time.Second

// WithNotificationProbeTimeout changes how long Listen waits for its test notification
// (default DefaultNotificationProbeTimeout).
func WithNotificationProbeTimeout(d time.Duration) Option {
	return func(o *options) { o.probe = d }
}

// New returns a binding to the outbox table through a new connection pool. The
// pool connects lazily, so a database that is down now is not an error here. The pool's size
// can be set in dataSource (pool_max_conns); it defaults to pgxpool's (the larger of 4 and the
// number of CPUs). The binding holds at most that many connections, and one more while it
// listens; idle ones close (see DefaultPoolMaxConnIdleTime).
//
// The binding keeps no state on a server connection between transactions, so it works through
// connection poolers in transaction or session mode (PgBouncer and the like): it sends no
// startup parameters of its own and uses no named prepared statements (see execMode).
func New(dataSource, outboxTable string, opt ...Option) (*Store, error) {
	opts := applyOptions(opt)
	table, err := outbox.QuoteTable(outboxTable)
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(dataSource)
	if err != nil {
		return nil, fmt.Errorf("parse data source: %w", err)
	}
	if !execModeSet.MatchString(dataSource) {
		cfg.ConnConfig.DefaultQueryExecMode = execMode
	}
	if !poolIdleSet.MatchString(dataSource) {
		cfg.MaxConnIdleTime = DefaultPoolMaxConnIdleTime
	}
	if !poolHealthSet.MatchString(dataSource) {
		cfg.HealthCheckPeriod = DefaultPoolHealthCheckPeriod
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	b, err := newStore(pool, table, outboxTable, opts)
	if err != nil {
		pool.Close()
		return nil, err
	}
	b.ownsPool = true
	return b, nil
}

// NewWithPool returns a binding to the outbox table through pool, which the caller keeps: the
// binding's Dispose leaves it open. The binding listens for notifications on a connection of its
// own, made from the pool's settings (or WithListenDataSource's). Use a pool with the settings
// New gives its own (see New): pgx's default query mode prepares statements on each server
// connection, which a pooler in transaction mode does not keep.
func NewWithPool(pool *pgxpool.Pool, outboxTable string, opt ...Option) (*Store, error) {
	table, err := outbox.QuoteTable(outboxTable)
	if err != nil {
		return nil, err
	}
	return newStore(pool, table, outboxTable, applyOptions(opt))
}

func applyOptions(opt []Option) options {
	opts := options{probe: DefaultNotificationProbeTimeout}
	for _, o := range opt {
		o(&opts)
	}
	return opts
}

// newStore is the binding to the outbox table (quoted as table) through pool.
func newStore(pool *pgxpool.Pool, table, outboxTable string, opts options) (*Store, error) {
	listen := pool.Config().ConnConfig.Copy()
	if opts.listenDataSource != "" {
		// Parsed as a pool's, so that pool settings copied from the data source (pool_max_conns)
		// are understood and dropped rather than sent to the server.
		listenCfg, err := pgxpool.ParseConfig(opts.listenDataSource)
		if err != nil {
			return nil, fmt.Errorf("parse listen data source: %w", err)
		}
		listen = listenCfg.ConnConfig
	}
	var answered *atomic.Int64
	if opts.listenDataSource == "" {
		answered = new(atomic.Int64)
	}
	return &Store{
		pool:     pool,
		listen:   listen,
		probe:    opts.probe,
		answered: answered,
		hub:      new(listenHub),
		channel:  outbox.NotifyChannel(outboxTable),
		table:    table,
		markSQL:  markStatement(table, "", "id"),
		readSQL:  readStatement(table, "", "id"),
		purgeSQL: `DELETE FROM ` + table + ` WHERE id = ANY($1)`,
		resetSQL: `UPDATE ` + table + ` SET leader_id = NULL WHERE id = ANY($1) AND leader_id = $2`,
		held:     newHeldSQL(outboxTable),
	}, nil
}

// Mark implements DatabaseBinding.
func (b *Store) Mark(ctx context.Context, leaderID uuid.UUID, limit int) ([]driver.MarkedRecord, error) {
	return b.claim(ctx, "mark outbox", b.markSQL, limit, leaderID, limit)
}

// claim runs a claim, sql (a mark or a read), and returns its rows, sorted by id.
//
// A shard's view runs it with bitmap scans off, in a transaction of its own sent in one round
// trip. Its rows are the oldest of the shard index, and at light load a shard holds few live
// rows: Postgres, which counts only those, then finds them with a bitmap scan and sorts them,
// and a bitmap scan visits the heap page of every entry the index still holds for a row purged
// since the last vacuum (at most once a minute by default, while a busy outbox purges hundreds of
// rows a second), every time. A walk of the index in order stops at the limit, and marks the
// entries of dead rows it passes so that the next walk skips them. (The whole table's claim walks
// the primary key in order without being told.)
func (b *Store) claim(ctx context.Context, op, sql string, limit int, args ...any) ([]driver.MarkedRecord, error) {
	if b.shard == "" {
		rows, err := b.pool.Query(ctx, sql, args...)
		return readMarked(op, rows, err, limit)
	}
	br := b.pool.SendBatch(ctx, shardClaimBatch(sql, args...))
	defer br.Close()
	for range 2 { // BEGIN and the setting
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
	}
	rows, err := br.Query()
	records, err := readMarked(op, rows, err, limit)
	if err != nil {
		return nil, err
	}
	// A mark that did not commit marked nothing: its rows must not be published as marked.
	if _, err := br.Exec(); err != nil {
		return nil, fmt.Errorf("%s: commit: %w", op, err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return records, nil
}

// shardClaimBatch is what claim sends for a shard's view.
func shardClaimBatch(sql string, args ...any) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue("SET LOCAL enable_bitmapscan = off")
	b.Queue(sql, args...)
	b.Queue("COMMIT")
	return b
}

// readMarked reads the rows of a mark, sorted by id.
func readMarked(op string, rows pgx.Rows, err error, limit int) ([]driver.MarkedRecord, error) {
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	defer rows.Close()

	records := make([]driver.MarkedRecord, 0, limit)
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, fmt.Errorf("%s: read row: %w", op, err)
		}
		records = append(records, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	slices.SortFunc(records, func(a, b driver.MarkedRecord) int { return cmp.Compare(a.ID, b.ID) })
	return records, nil
}

// scanRecord reads one row of outboxSelect, after the columns in extra.
func scanRecord(rows pgx.Rows, extra ...any) (driver.MarkedRecord, error) {
	// Every column is read in a form that accepts NULLs and any array shape, so that one odd
	// row becomes a RecordError for that row instead of failing the whole batch: the batch is
	// already marked, and rows marked but never returned would sit unpublished.
	var (
		row                   outboxRow
		headerKeys, headerVal pgtype.Array[payload]
	)
	if err := rows.Scan(append(extra, &row.id, &row.createTime, &row.topic, &row.key, &row.value,
		&headerKeys, &headerVal, &row.leaderID)...); err != nil {
		return driver.MarkedRecord{}, err
	}
	return row.record(headerKeys, headerVal), nil
}

type outboxRow struct {
	id         int64
	createTime pgtype.Timestamptz
	topic      pgtype.Text
	key, value payload
	leaderID   pgtype.UUID
}

func (r outboxRow) record(headerKeys, headerValues pgtype.Array[payload]) driver.MarkedRecord {
	m := driver.MarkedRecord{OutboxRecord: outbox.Record{
		ID:         r.id,
		CreateTime: r.createTime.Time,
		KafkaTopic: r.topic.String,
		KafkaKey:   r.key.s,
	}}
	if r.value.valid {
		m.KafkaValue = &r.value.s
	}
	if r.leaderID.Valid {
		id := uuid.UUID(r.leaderID.Bytes)
		m.LeaderID = &id
	}
	var problems []string
	if !r.topic.Valid {
		problems = append(problems, "kafka_topic is NULL")
	}
	if !r.key.valid {
		problems = append(problems, "kafka_key is NULL")
	}
	if !r.createTime.Valid {
		problems = append(problems, "create_time is NULL")
	}
	headers, headerProblem := pairHeaders(headerKeys, headerValues)
	if headerProblem != "" {
		problems = append(problems, headerProblem)
	}
	m.KafkaHeaders = headers
	if len(problems) > 0 {
		m.Err = &driver.RecordError{ID: r.id, Reason: strings.Join(problems, "; ")}
	}
	return m
}

// pairHeaders zips the header key and value arrays. NULL arrays count as empty.
func pairHeaders(keys, values pgtype.Array[payload]) (outbox.Headers, string) {
	if len(keys.Dims) > 1 || len(values.Dims) > 1 {
		return nil, "header arrays must be one-dimensional"
	}
	if len(keys.Elements) != len(values.Elements) {
		return nil, fmt.Sprintf("kafka_header_keys has %d elements but kafka_header_values has %d",
			len(keys.Elements), len(values.Elements))
	}
	headers := make(outbox.Headers, len(keys.Elements))
	for i := range keys.Elements {
		if !keys.Elements[i].valid || !values.Elements[i].valid {
			return nil, fmt.Sprintf("header %d has a NULL key or value", i)
		}
		headers[i] = outbox.Header{Key: keys.Elements[i].s, Value: values.Elements[i].s}
	}
	return headers, ""
}

// Purge implements DatabaseBinding with one DELETE for all the IDs.
func (b *Store) Purge(ctx context.Context, ids []int64) (int, error) {
	if server, ok := driver.ServerOf(ctx); ok {
		return b.purgeOn(ctx, server, ids) // postgres_failover.go
	}
	tag, err := b.pool.Exec(ctx, b.purgeSQL, ids)
	if err != nil {
		return 0, fmt.Errorf("purge outbox: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Reset implements DatabaseBinding with one UPDATE for all the IDs.
func (b *Store) Reset(ctx context.Context, leaderID uuid.UUID, ids []int64) (int, error) {
	tag, err := b.pool.Exec(ctx, b.resetSQL, ids, leaderID)
	if err != nil {
		return 0, fmt.Errorf("reset outbox: %w", err)
	}
	return int(tag.RowsAffected()), nil
}

// Dispose implements DatabaseBinding.
func (b *Store) Dispose() {
	if b.shard == "" && b.ownsPool {
		b.pool.Close()
	}
}

// Backlog counts the outbox's records, up to limit, and finds the oldest's creation time; both
// walk the primary key, so they stay cheap however large the table.
func (b *Store) Backlog(ctx context.Context, limit int) (int, time.Time, error) {
	var (
		n      int
		oldest pgtype.Timestamptz
	)
	where, order := "", "id"
	if b.shard != "" {
		where, order = " WHERE true"+b.shard, b.shardOrder
	}
	err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM (SELECT 1 FROM `+b.table+where+` LIMIT $1) AS s),
		(SELECT create_time FROM `+b.table+where+` ORDER BY `+order+` LIMIT 1)`, limit).Scan(&n, &oldest)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("sample outbox backlog: %w", err)
	}
	return n, oldest.Time, nil
}

// The store offers every optional capability; checked here, so that renaming a method cannot
// silently turn a feature off.
var (
	_ driver.Store            = (*Store)(nil)
	_ driver.Reader           = (*Store)(nil)
	_ driver.SchemaChecker    = (*Store)(nil)
	_ driver.Listener         = (*Store)(nil)
	_ driver.CoveringListener = (*Store)(nil)
	_ driver.Pinger           = (*Store)(nil)
	_ driver.BacklogSampler   = (*Store)(nil)
	_ driver.Sharder          = (*Store)(nil)
	_ driver.RecoveryChecker  = (*Store)(nil)
	_ driver.StandbyWaiter    = (*Store)(nil)
	_ driver.ServerIdentifier = (*Store)(nil)
)
