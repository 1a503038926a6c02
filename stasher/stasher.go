// Package stasher writes outbox records inside the caller's transaction, so that a message is
// published if and only if the business data written with it commits.
//
// It works with a *sql.Tx from any database/sql driver (pgx's stdlib, lib/pq, ...) through
// Stash and Prepare, and with a pgx.Tx through StashPgx. It never commits or rolls back: the
// transaction belongs to the caller.
package stasher

import (
	"context"
	"database/sql"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/pgname"
)

// rowsPerStatement bounds one INSERT: six parameters per row stays far below Postgres's limit
// of 65,535 parameters, and larger statements gain nothing measurable.
const rowsPerStatement = 1000

const paramsPerRow = 6

// SQLExecer is what Stash needs of a database/sql transaction. *sql.Tx satisfies it (as do
// *sql.Conn and *sql.DB, which stash outside any transaction of the caller's).
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// PgxExecer is what StashPgx needs of a pgx transaction. pgx.Tx satisfies it (as do *pgx.Conn
// and *pgxpool.Pool).
type PgxExecer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Stasher writes records to one outbox table. It is safe for concurrent use.
type Stasher struct {
	table string // quoted
}

// New returns a Stasher for the named outbox table ("outbox", or schema-qualified "app.outbox";
// quoted as written, so case matters).
func New(outboxTable string) (*Stasher, error) {
	table, err := pgname.QuoteTable(outboxTable)
	if err != nil {
		return nil, fmt.Errorf("stasher: %w", err)
	}
	return &Stasher{table: table}, nil
}

// Stash writes records to the outbox in tx, in the given order, using as few INSERT statements
// as it can (one per thousand records). Records are checked first: if any is invalid, nothing
// is written and the error names the record. A record's CreateTime defaults to the database's
// now(); its ID and LeaderID are ignored.
func (s *Stasher) Stash(ctx context.Context, tx SQLExecer, records ...goharvest.OutboxRecord) error {
	return s.stash(records, func(query string, args []any) error {
		_, err := tx.ExecContext(ctx, query, args...)
		return err
	})
}

// StashPgx is Stash for a pgx transaction.
func (s *Stasher) StashPgx(ctx context.Context, tx PgxExecer, records ...goharvest.OutboxRecord) error {
	return s.stash(records, func(query string, args []any) error {
		_, err := tx.Exec(ctx, query, args...)
		return err
	})
}

func (s *Stasher) stash(records []goharvest.OutboxRecord, exec func(query string, args []any) error) error {
	for i := range records {
		if err := validate(records[i]); err != nil {
			return fmt.Errorf("stash record %d (key %q): %w", i, records[i].KafkaKey, err)
		}
	}
	for start := 0; start < len(records); start += rowsPerStatement {
		chunk := records[start:min(start+rowsPerStatement, len(records))]
		args := make([]any, 0, len(chunk)*paramsPerRow)
		for _, rec := range chunk {
			args = appendArgs(args, rec)
		}
		if err := exec(s.insertSQL(len(chunk)), args); err != nil {
			return fmt.Errorf("stash %d records into outbox: %w", len(chunk), err)
		}
	}
	return nil
}

// insertSQL builds an INSERT of n rows. create_time falls back to now() when no time is given;
// header arrays travel as array literals cast from text, which every driver can send.
func (s *Stasher) insertSQL(n int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO ")
	b.WriteString(s.table)
	b.WriteString(" (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) VALUES ")
	for row := range n {
		if row > 0 {
			b.WriteByte(',')
		}
		p := row*paramsPerRow + 1
		fmt.Fprintf(&b, "(COALESCE($%d::timestamptz, now()), $%d, $%d, $%d, $%d::text::text[], $%d::text::text[])",
			p, p+1, p+2, p+3, p+4, p+5)
	}
	return b.String()
}

func appendArgs(args []any, rec goharvest.OutboxRecord) []any {
	var createTime any // NULL: the database's now()
	if !rec.CreateTime.IsZero() {
		createTime = rec.CreateTime.Format(time.RFC3339Nano)
	}
	var value any // NULL: a tombstone
	if rec.KafkaValue != nil {
		value = *rec.KafkaValue
	}
	keys := make([]string, len(rec.KafkaHeaders))
	values := make([]string, len(rec.KafkaHeaders))
	for i, h := range rec.KafkaHeaders {
		keys[i], values[i] = h.Key, h.Value
	}
	return append(args, createTime, rec.KafkaTopic, rec.KafkaKey, value, arrayLiteral(keys), arrayLiteral(values))
}

// arrayLiteral writes strings as a Postgres text[] literal, every element quoted, so that
// commas, braces, quotes, backslashes and the word NULL all survive as written.
func arrayLiteral(elems []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, r := range e {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}

// topicName matches the names Kafka accepts for topics.
var topicName = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)

func validate(rec goharvest.OutboxRecord) error {
	if !topicName.MatchString(rec.KafkaTopic) || rec.KafkaTopic == "." || rec.KafkaTopic == ".." {
		return fmt.Errorf("kafka topic %s is not a valid topic name (1 to 249 letters, digits, '.', '_' or '-')",
			strconv.Quote(rec.KafkaTopic))
	}
	if strings.ContainsRune(rec.KafkaKey, 0) {
		return fmt.Errorf("kafka key contains a NUL byte, which Postgres text cannot store")
	}
	if rec.KafkaValue != nil && strings.ContainsRune(*rec.KafkaValue, 0) {
		return fmt.Errorf("kafka value contains a NUL byte, which Postgres text cannot store")
	}
	for i, h := range rec.KafkaHeaders {
		if strings.ContainsRune(h.Key, 0) || strings.ContainsRune(h.Value, 0) {
			return fmt.Errorf("header %d contains a NUL byte, which Postgres text cannot store", i)
		}
	}
	return nil
}

// Prepare returns a PreStash that stashes one record at a time through a statement prepared
// once in tx, for callers that write records one by one in a loop. (Stash with many records is
// faster still. pgx prepares and caches statements by itself, so StashPgx needs no Prepare.)
func (s *Stasher) Prepare(ctx context.Context, tx *sql.Tx) (*PreStash, error) {
	stmt, err := tx.PrepareContext(ctx, s.insertSQL(1))
	if err != nil {
		return nil, fmt.Errorf("prepare stash: %w", err)
	}
	return &PreStash{stmt: stmt}, nil
}

// PreStash stashes records through a prepared statement. It lives as long as its transaction.
type PreStash struct {
	stmt *sql.Stmt
}

// Stash writes one record, as Stasher.Stash does.
func (p *PreStash) Stash(ctx context.Context, rec goharvest.OutboxRecord) error {
	if err := validate(rec); err != nil {
		return fmt.Errorf("stash record (key %q): %w", rec.KafkaKey, err)
	}
	if _, err := p.stmt.ExecContext(ctx, appendArgs(nil, rec)...); err != nil {
		return fmt.Errorf("stash record into outbox: %w", err)
	}
	return nil
}

// Close releases the prepared statement. Ending the transaction releases it too.
func (p *PreStash) Close() error { return p.stmt.Close() }
