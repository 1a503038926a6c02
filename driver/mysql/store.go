package mysql

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/outbox"
)

// Store is the store for an outbox in MySQL or MariaDB, on a database/sql pool. See the package
// documentation for how it claims rows and at which isolation level.
type Store struct {
	db     *sql.DB
	ownsDB bool   // New made the pool, so Dispose closes it; NewWithDB's is the caller's
	name   string // the table as configured, for errors
	table  string // quoted
	dead   string // the dead-letter table, quoted
	// shard limits a shard's view (see Shard) to its rows: empty for the whole table. A view
	// shares its parent's pool, which only the parent disposes.
	shard conditions
	view  bool
}

// outboxSelect lists the columns the harvester reads, in outboxRow.dest's order. create_time is
// read as seconds since the epoch: for a TIMESTAMP column UNIX_TIMESTAMP returns the stored
// instant as it is, to the microsecond, whatever the session's time zone and whether or not the
// data source asks for parseTime.
const outboxSelect = `id, UNIX_TIMESTAMP(create_time), kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values, leader_id`

// DefaultConnMaxIdleTime is how long the pool of New keeps a connection that nothing uses, as the
// Postgres store's pool does; a server closes connections idle for wait_timeout (8 hours by
// default), and the driver checks a connection before reusing it.
const DefaultConnMaxIdleTime = 10 * time.Second

// Option adjusts a Store made by New.
type Option func(*options)

type options struct {
	maxOpenConns int
}

// WithMaxOpenConns caps the connections of New's pool; the default is the larger of 4 and the
// number of CPUs, as for the Postgres store.
func WithMaxOpenConns(n int) Option {
	return func(o *options) { o.maxOpenConns = n }
}

// interpolateSet matches a data source that says whether to interpolate parameters.
var interpolateSet = regexp.MustCompile(`[?&]interpolateParams=`)

// openDB opens a pool on a go-sql-driver data source. Unless the data source says otherwise,
// parameters are interpolated on the client (interpolateParams): a statement is then one round
// trip, not a prepare, an execution and a close, and no server-side statement outlives it, as
// with the Postgres store's exec mode.
func openDB(dataSource string) (*sql.DB, error) {
	cfg, err := gomysql.ParseDSN(dataSource)
	if err != nil {
		return nil, fmt.Errorf("parse data source: %w", err)
	}
	if !interpolateSet.MatchString(dataSource) {
		cfg.InterpolateParams = true
	}
	connector, err := gomysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("parse data source: %w", err)
	}
	return sql.OpenDB(connector), nil
}

// New returns a store on the outbox table (optionally qualified by its database: "shop.outbox")
// through a new pool on dataSource, a go-sql-driver data source
// ("user:password@tcp(host:3306)/database"). The pool connects lazily, so a database that is
// down now is not an error here.
func New(dataSource, outboxTable string, opt ...Option) (*Store, error) {
	opts := options{maxOpenConns: max(4, runtime.NumCPU())}
	for _, o := range opt {
		o(&opts)
	}
	db, err := openDB(dataSource)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(opts.maxOpenConns)
	db.SetMaxIdleConns(opts.maxOpenConns)
	db.SetConnMaxIdleTime(DefaultConnMaxIdleTime)
	s, err := NewWithDB(db, outboxTable)
	if err != nil {
		db.Close()
		return nil, err
	}
	s.ownsDB = true
	return s, nil
}

// NewWithDB returns a store on the outbox table through db, which the caller keeps: Dispose
// leaves it open. Its sessions must keep autocommit on (see the package documentation);
// interpolateParams saves round trips, as New's pool has it.
func NewWithDB(db *sql.DB, outboxTable string) (*Store, error) {
	table, dead, err := quoteTables(outboxTable)
	if err != nil {
		return nil, err
	}
	return &Store{db: db, name: outboxTable, table: table, dead: dead}, nil
}

// conditions is a WHERE clause in the making, with its arguments.
type conditions struct {
	clauses []string
	args    []any
}

func (c conditions) and(clause string, args ...any) conditions {
	return conditions{
		clauses: append(c.clauses[:len(c.clauses):len(c.clauses)], clause),
		args:    append(c.args[:len(c.args):len(c.args)], args...),
	}
}

// notHeld leaves out the rows of the given keys, compared as bytes, as the engine compares keys:
// cast, so that a text kafka_key with a case- or space-insensitive collation does not make "a"
// or "a " held along with "A" (a binary argument alone would not do: the column's collation wins
// the comparison).
func (c conditions) notHeld(keys []string) conditions {
	if len(keys) == 0 {
		return c
	}
	args := make([]any, len(keys))
	for i, k := range keys {
		args[i] = []byte(k)
	}
	return c.and("CAST(kafka_key AS BINARY) NOT IN ("+strings.Repeat("?, ", len(keys)-1)+"?)", args...)
}

// notMarkedBy leaves out the rows that leader has marked.
func (c conditions) notMarkedBy(leader uuid.UUID) conditions {
	return c.and("(leader_id IS NULL OR leader_id <> ?)", leader.String())
}

func (c conditions) where() string {
	if len(c.clauses) == 0 {
		return ""
	}
	return " WHERE " + strings.Join(c.clauses, " AND ")
}

// idList writes ids as a list of literals for IN: integers need no quoting, and a list of
// thousands (the ids an epoch holds) is then one short statement rather than as many
// placeholders, of which a prepared statement may have at most 65,535.
func idList(ids []int64) string {
	var b strings.Builder
	for i, id := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.FormatInt(id, 10))
	}
	return b.String()
}

// Read implements driver.Reader with one SELECT, in autocommit: it writes nothing and locks
// nothing.
func (s *Store) Read(ctx context.Context, limit int, heldKeys []string, exclude []int64) ([]driver.MarkedRecord, error) {
	c := s.shard.notHeld(heldKeys)
	if len(exclude) > 0 {
		c = c.and("id NOT IN (" + idList(exclude) + ")")
	}
	rows, err := s.db.QueryContext(ctx, `SELECT `+outboxSelect+` FROM `+s.table+c.where()+` ORDER BY id LIMIT ?`,
		append(c.args, limit)...)
	recs, err := collect(rows, err)
	if err != nil {
		return nil, fmt.Errorf("read outbox %s: %w", s.name, err)
	}
	return recs, nil
}

// Mark implements DatabaseBinding.
func (s *Store) Mark(ctx context.Context, leaderID uuid.UUID, limit int) ([]driver.MarkedRecord, error) {
	return s.MarkExcept(ctx, leaderID, limit, nil)
}

// MarkExcept implements HeldRowBinding: in one transaction at READ COMMITTED, it picks the
// oldest rows it may mark with a consistent read (which does not wait for rows still being
// inserted), locks those rows by id (joinIDs), keeping the ones that still qualify in their
// latest committed version, and stamps them. MySQL has no UPDATE ... RETURNING, and an UPDATE ... ORDER
// BY id LIMIT n would leave no way to tell the rows it stamped from those the leader marked
// before.
func (s *Store) MarkExcept(ctx context.Context, leaderID uuid.UUID, limit int, heldKeys []string) ([]driver.MarkedRecord, error) {
	c := s.shard.notMarkedBy(leaderID).notHeld(heldKeys)
	var recs []driver.MarkedRecord
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		ids, err := queryIDs(ctx, tx, `SELECT id FROM `+s.table+c.where()+` ORDER BY id LIMIT ?`, append(c.args, limit)...)
		if err != nil || len(ids) == 0 {
			return err
		}
		rows, err := tx.QueryContext(ctx, `SELECT `+outboxSelect+` FROM `+joinIDs(s.table, ids)+c.where()+` ORDER BY id FOR UPDATE`, c.args...)
		if recs, err = collect(rows, err); err != nil || len(recs) == 0 {
			return err
		}
		locked := make([]int64, len(recs))
		for i, r := range recs {
			locked[i] = r.ID
		}
		_, err = tx.ExecContext(ctx, `UPDATE `+joinIDs(s.table, locked)+` SET o.leader_id = ?`, leaderID.String())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("mark outbox %s: %w", s.name, err)
	}
	for i := range recs {
		recs[i].LeaderID = &leaderID
	}
	return recs, nil
}

// inTx runs do in a transaction at READ COMMITTED (see the package documentation), and commits
// it if do succeeds.
func (s *Store) inTx(ctx context.Context, do func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return err
	}
	defer tx.Rollback() // after a commit, does nothing
	if err := do(tx); err != nil {
		return err
	}
	return tx.Commit()
}

func queryIDs(ctx context.Context, tx *sql.Tx, query string, args ...any) ([]int64, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// collect reads rows of outboxSelect.
func collect(rows *sql.Rows, err error) ([]driver.MarkedRecord, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var recs []driver.MarkedRecord
	for rows.Next() {
		rec, err := scan(rows)
		if err != nil {
			return nil, err
		}
		recs = append(recs, rec)
	}
	return recs, rows.Err()
}

// scan reads one row of outboxSelect, after the columns in extra.
func scan(rows *sql.Rows, extra ...any) (driver.MarkedRecord, error) {
	var r outboxRow
	if err := rows.Scan(append(extra, r.dest()...)...); err != nil {
		return driver.MarkedRecord{}, fmt.Errorf("read row: %w", err)
	}
	return r.record(), nil
}

// outboxRow is a row as read: every column in a form that accepts NULL and any content, so that
// one odd row becomes a RecordError for that row instead of failing the whole batch, which may
// be marked already.
type outboxRow struct {
	id                 int64
	createTime         sql.NullString // seconds since the epoch, with up to 6 decimals
	topic              sql.NullString
	key, value         sql.Null[[]byte]
	headerKeys, values sql.NullString
	leaderID           sql.NullString
}

func (r *outboxRow) dest() []any {
	return []any{&r.id, &r.createTime, &r.topic, &r.key, &r.value, &r.headerKeys, &r.values, &r.leaderID}
}

func (r *outboxRow) record() driver.MarkedRecord {
	m := driver.MarkedRecord{OutboxRecord: outbox.Record{ID: r.id, KafkaTopic: r.topic.String, KafkaKey: string(r.key.V)}}
	if r.value.Valid {
		v := string(r.value.V)
		m.KafkaValue = &v
	}
	// A leader_id that is not a UUID was written by no harvester; it reads as no leader, and a
	// mark overwrites it.
	if id, err := uuid.Parse(r.leaderID.String); r.leaderID.Valid && err == nil {
		m.LeaderID = &id
	}
	var problems []string
	if !r.topic.Valid {
		problems = append(problems, "kafka_topic is NULL")
	}
	if !r.key.Valid {
		problems = append(problems, "kafka_key is NULL")
	}
	if !r.createTime.Valid {
		problems = append(problems, "create_time is NULL")
	} else if t, err := parseUnix(r.createTime.String); err != nil {
		problems = append(problems, err.Error())
	} else {
		m.CreateTime = t
	}
	headers, problem := zipHeaders(r.headerKeys, r.values)
	if problem != "" {
		problems = append(problems, problem)
	}
	m.KafkaHeaders = headers
	if len(problems) > 0 {
		m.Err = &driver.RecordError{ID: r.id, Reason: strings.Join(problems, "; ")}
	}
	return m
}

// parseUnix parses UNIX_TIMESTAMP's answer, "1764349000.123456", exactly: as a float it would
// lose the microseconds.
func parseUnix(s string) (time.Time, error) {
	secs, frac, _ := strings.Cut(s, ".")
	sec, err := strconv.ParseInt(secs, 10, 64)
	if err != nil || len(frac) > 9 {
		return time.Time{}, fmt.Errorf("create_time reads as %q, not seconds since the epoch", s)
	}
	nsec, err := strconv.ParseInt((frac + "000000000")[:9], 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("create_time reads as %q, not seconds since the epoch", s)
	}
	return time.Unix(sec, nsec), nil
}

// zipHeaders pairs the header keys and values, JSON arrays of strings; NULL counts as empty.
func zipHeaders(keys, values sql.NullString) (outbox.Headers, string) {
	var k, v []*string
	for _, col := range []struct {
		name string
		json sql.NullString
		into *[]*string
	}{{"kafka_header_keys", keys, &k}, {"kafka_header_values", values, &v}} {
		if col.json.Valid {
			if err := json.Unmarshal([]byte(col.json.String), col.into); err != nil {
				return nil, col.name + " is not a JSON array of strings: " + err.Error()
			}
		}
	}
	if len(k) != len(v) {
		return nil, fmt.Sprintf("kafka_header_keys has %d elements but kafka_header_values has %d", len(k), len(v))
	}
	headers := make(outbox.Headers, len(k))
	for i := range k {
		if k[i] == nil || v[i] == nil {
			return nil, fmt.Sprintf("header %d has a null key or value", i)
		}
		headers[i] = outbox.Header{Key: *k[i], Value: *v[i]}
	}
	return headers, ""
}

// joinIDs is the table, as o, joined to the given ids, for a statement that locks rows by id (an
// UPDATE, a DELETE, a SELECT ... FOR UPDATE): STRAIGHT_JOIN walks the ids, and FORCE INDEX has
// each looked up in the primary key, so the statement touches exactly those rows. With "WHERE id
// IN (...)" the optimizer may scan the whole table instead (MariaDB does when the ids are a good
// part of a small table, FORCE INDEX or not; and without FORCE INDEX, when the table has a row or
// two, it scans it for each id), and a locking scan queues behind the first row of any writer's
// open transaction, for as long as the writer takes (TestNothingWaitsForAnOpenWriter). An id that
// is gone is no row, and locks nothing at READ COMMITTED. JSON_TABLE (MariaDB 10.6, MySQL 8.0)
// makes a table of a list of any length from one literal.
func joinIDs(table string, ids []int64) string {
	return `JSON_TABLE('[` + idList(ids) + `]', '$[*]' COLUMNS (wanted_id BIGINT PATH '$')) AS wanted STRAIGHT_JOIN ` +
		table + ` AS o FORCE INDEX (PRIMARY) ON o.id = wanted.wanted_id`
}

// Purge implements DatabaseBinding with one DELETE for all the ids, in autocommit: it locks the
// rows it deletes (see joinIDs) and, under REPEATABLE READ, the gap where an id is gone already,
// which only holds back an insert into that gap for the moment the statement lasts; it waits for
// nothing but a lock on the rows it deletes.
func (s *Store) Purge(ctx context.Context, ids []int64) (int, error) {
	n, err := s.execIDs(ctx, `DELETE o FROM `+joinIDs(s.table, ids), ids)
	if err != nil {
		return 0, fmt.Errorf("purge outbox %s: %w", s.name, err)
	}
	return n, nil
}

// Reset implements DatabaseBinding with one UPDATE for all the ids, in autocommit.
func (s *Store) Reset(ctx context.Context, leaderID uuid.UUID, ids []int64) (int, error) {
	n, err := s.execIDs(ctx, `UPDATE `+joinIDs(s.table, ids)+` SET o.leader_id = NULL WHERE o.leader_id = ?`, ids, leaderID.String())
	if err != nil {
		return 0, fmt.Errorf("reset outbox %s: %w", s.name, err)
	}
	return n, nil
}

// execIDs runs a statement on the rows with the given ids and returns how many it changed; with
// no ids it runs nothing, as an empty list would change nothing.
func (s *Store) execIDs(ctx context.Context, statement string, ids []int64, args ...any) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	res, err := s.db.ExecContext(ctx, statement, args...)
	if err != nil {
		return 0, err
	}
	changed, err := res.RowsAffected()
	return int(changed), err
}

// Dispose implements DatabaseBinding: it closes the pool New made, and leaves NewWithDB's and a
// shard view's parent's.
func (s *Store) Dispose() {
	if s.ownsDB && !s.view {
		s.db.Close()
	}
}

// Ping implements driver.Pinger.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("ping outbox %s: %w", s.name, err)
	}
	return nil
}

// Backlog implements driver.BacklogSampler: both the count (up to limit) and the oldest row walk
// the primary key from its head, so they stay cheap however large the table.
func (s *Store) Backlog(ctx context.Context, limit int) (int, time.Time, error) {
	var (
		n      int
		oldest sql.NullString
	)
	where := s.shard.where() // a shard's condition has no arguments: its number is in the text
	err := s.db.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM `+s.table+where+` LIMIT ?) AS s),
		(SELECT UNIX_TIMESTAMP(create_time) FROM `+s.table+where+` ORDER BY id LIMIT 1)`, limit).Scan(&n, &oldest)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("sample outbox %s backlog: %w", s.name, err)
	}
	if !oldest.Valid {
		return n, time.Time{}, nil
	}
	t, err := parseUnix(oldest.String)
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("sample outbox %s backlog: %w", s.name, err)
	}
	return n, t, nil
}

// ShardSQL is outbox.Shard as a MySQL expression over the key column: the first 28 bits of the
// key's MD5 digest modulo shards, as outbox.ShardSQL computes it in Postgres, so that the
// harvester, a writer in any language and the Postgres store agree on a key's shard.
func ShardSQL(keyColumn string, shards int) string {
	return fmt.Sprintf("(CONV(LEFT(MD5(%s), 7), 16, 10) %% %d)", keyColumn, shards)
}

// Shard implements driver.Sharder: a view of the store whose reads, marks and backlog see only
// the rows of one shard of shards (Config.Shards); purges, resets and re-reads work by id and
// are the same. Each shard's claim walks the primary key from the head and skips the other
// shards' rows: there is no index on the shard yet (MySQL needs a generated column for one), so
// a claim costs more the more rows the other shards have ahead of its own.
func (s *Store) Shard(shard, shards int) driver.DatabaseBinding {
	v := *s
	v.view = true
	if shards > 1 {
		v.shard = conditions{}.and(ShardSQL("kafka_key", shards) + " = " + strconv.Itoa(shard))
	}
	return &v
}

// The store's capabilities, checked here so that renaming a method cannot silently turn one
// off. It is no Listener: MySQL has no LISTEN/NOTIFY, and the harvester polls.
var (
	_ driver.Sharder        = (*Store)(nil)
	_ driver.Store          = (*Store)(nil)
	_ driver.Reader         = (*Store)(nil)
	_ driver.SchemaChecker  = (*Store)(nil)
	_ driver.Pinger         = (*Store)(nil)
	_ driver.BacklogSampler = (*Store)(nil)
)
