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
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/goharvest/goharvest/outbox"
)

// rowsPerStatement bounds one INSERT, so that a statement stays a reasonable size; larger
// statements gain nothing measurable.
const rowsPerStatement = 1000

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
	// Which payload columns are bytea (kafka_header_values bytea[]) rather than text.
	keyBytea, valueBytea, headerBytea bool
	// valueJSON: kafka_value is json or jsonb.
	valueJSON bool
}

// Option configures a Stasher.
type Option func(*Stasher) error

// The payload columns that may be bytea, as ByteaColumns names them.
const (
	KeyColumn          = "kafka_key"
	ValueColumn        = "kafka_value"
	HeaderValuesColumn = "kafka_header_values"
)

// ByteaColumns says which of the outbox's payload columns are bytea rather than text (for
// kafka_header_values: bytea[] rather than text[]): any of KeyColumn, ValueColumn and
// HeaderValuesColumn, or all three when none is named (the table that
// goharvest.CreateOutboxTableWith makes with TableOptions{Bytea: true}). Their bytes are then
// written as they are, zero bytes and invalid UTF-8 included. Without this option every column
// is written as text, which Postgres refuses for a bytea column.
func ByteaColumns(columns ...string) Option {
	return func(s *Stasher) error {
		if len(columns) == 0 {
			columns = []string{KeyColumn, ValueColumn, HeaderValuesColumn}
		}
		for _, c := range columns {
			switch c {
			case KeyColumn:
				s.keyBytea = true
			case ValueColumn:
				s.valueBytea = true
			case HeaderValuesColumn:
				s.headerBytea = true
			default:
				return fmt.Errorf("ByteaColumns: %q is not %s, %s or %s", c, KeyColumn, ValueColumn, HeaderValuesColumn)
			}
		}
		return nil
	}
}

// JSONValue says that the outbox's kafka_value column is json or jsonb. Values are then written
// as JSON text, which Postgres checks; a value that is not JSON is refused. (Without this
// option a text value is refused by a json or jsonb column.)
func JSONValue() Option {
	return func(s *Stasher) error {
		s.valueJSON = true
		return nil
	}
}

// New returns a Stasher for the named outbox table ("outbox", or schema-qualified "app.outbox";
// quoted as written, so case matters).
func New(outboxTable string, opts ...Option) (*Stasher, error) {
	table, err := outbox.QuoteTable(outboxTable)
	if err != nil {
		return nil, fmt.Errorf("stasher: %w", err)
	}
	s := &Stasher{table: table}
	for _, opt := range opts {
		if err := opt(s); err != nil {
			return nil, fmt.Errorf("stasher: %w", err)
		}
	}
	return s, nil
}

// Stash writes records to the outbox in tx, in the given order, using as few INSERT statements
// as it can (one per thousand records). Records are checked first: if any is invalid, nothing
// is written and the error names the record. A record's CreateTime defaults to the database's
// now(); its ID and LeaderID are ignored.
//
// The values travel in the statement as quoted literals, not as parameters, so that every
// driver sends it as one simple query: no prepared statement, named or unnamed, that a
// connection pooler in transaction mode (PgBouncer's pool_mode = transaction) could lose between
// one round trip and the next, whatever the driver's own settings.
func (s *Stasher) Stash(ctx context.Context, tx SQLExecer, records ...outbox.Record) error {
	return s.stash(records, func(query string) error {
		_, err := tx.ExecContext(ctx, query)
		return err
	})
}

// StashPgx is Stash for a pgx transaction.
func (s *Stasher) StashPgx(ctx context.Context, tx PgxExecer, records ...outbox.Record) error {
	return s.stash(records, func(query string) error {
		_, err := tx.Exec(ctx, query)
		return err
	})
}

func (s *Stasher) stash(records []outbox.Record, exec func(query string) error) error {
	for i := range records {
		if err := s.validate(records[i]); err != nil {
			return fmt.Errorf("stash record %d (key %q): %w", i, records[i].KafkaKey, err)
		}
	}
	for start := 0; start < len(records); start += rowsPerStatement {
		chunk := records[start:min(start+rowsPerStatement, len(records))]
		if err := exec(s.insertSQL(chunk)); err != nil {
			return fmt.Errorf("stash %d records into outbox: %w", len(chunk), err)
		}
	}
	return nil
}

// insertSQL builds an INSERT of the records, each value a quoted literal (see quote).
// create_time falls back to now() when no time is given; header arrays are array literals cast
// from text. Text is typed text, so that Postgres refuses it for a bytea column (whose input
// would read backslashes as escapes) or a json one, rather than guess; bytes travel in bytea's
// hex form, which any bytes survive, and JSON as text cast to json (which a jsonb column takes
// as well).
func (s *Stasher) insertSQL(records []outbox.Record) string {
	var b strings.Builder
	b.WriteString("INSERT INTO ")
	b.WriteString(s.table)
	b.WriteString(" (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) VALUES ")
	for i, rec := range records {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		if rec.CreateTime.IsZero() {
			b.WriteString("now()")
		} else {
			quote(&b, rec.CreateTime.Format(time.RFC3339Nano))
			b.WriteString("::timestamptz")
		}
		b.WriteByte(',')
		quote(&b, rec.KafkaTopic)
		b.WriteByte(',')
		if s.keyBytea {
			quoteBytea(&b, rec.KafkaKey)
		} else {
			quote(&b, rec.KafkaKey)
			b.WriteString("::text")
		}
		b.WriteByte(',')
		switch {
		case rec.KafkaValue == nil:
			b.WriteString("NULL") // a tombstone
		case s.valueBytea:
			quoteBytea(&b, *rec.KafkaValue)
		case s.valueJSON:
			quote(&b, *rec.KafkaValue)
			b.WriteString("::text::json")
		default:
			quote(&b, *rec.KafkaValue)
			b.WriteString("::text")
		}
		keys := make([]string, len(rec.KafkaHeaders))
		values := make([]string, len(rec.KafkaHeaders))
		for i, h := range rec.KafkaHeaders {
			keys[i], values[i] = h.Key, h.Value
			if s.headerBytea {
				values[i] = `\x` + hex.EncodeToString([]byte(h.Value))
			}
		}
		b.WriteByte(',')
		quote(&b, arrayLiteral(keys))
		b.WriteString("::text[],")
		quote(&b, arrayLiteral(values))
		if s.headerBytea {
			b.WriteString("::text::bytea[])")
		} else {
			b.WriteString("::text[])")
		}
	}
	return b.String()
}

// quote writes s as an escape string constant, E'...', with quotes and backslashes escaped:
// its meaning does not depend on standard_conforming_strings. validate has rejected NUL bytes,
// and the drivers speak UTF-8, in which no byte of a multi-byte character is a quote or a
// backslash, so nothing in s can end the literal.
func quote(b *strings.Builder, s string) {
	b.WriteString("E'")
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\'', '\\':
			b.WriteByte(s[i])
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('\'')
}

// quoteBytea writes bytes as a bytea literal in hex form, which any bytes survive.
func quoteBytea(b *strings.Builder, bytes string) {
	quote(b, `\x`+hex.EncodeToString([]byte(bytes)))
	b.WriteString("::bytea")
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

func (s *Stasher) validate(rec outbox.Record) error {
	if err := outbox.CheckName(rec.KafkaTopic); err != nil {
		return fmt.Errorf("kafka topic %s is not a valid topic name: %w", strconv.Quote(rec.KafkaTopic), err)
	}
	if !s.keyBytea && strings.ContainsRune(rec.KafkaKey, 0) {
		return fmt.Errorf("kafka key contains a NUL byte, which Postgres text cannot store")
	}
	if !s.valueBytea && rec.KafkaValue != nil && strings.ContainsRune(*rec.KafkaValue, 0) {
		return fmt.Errorf("kafka value contains a NUL byte, which Postgres text cannot store")
	}
	for i, h := range rec.KafkaHeaders {
		if strings.ContainsRune(h.Key, 0) || (!s.headerBytea && strings.ContainsRune(h.Value, 0)) {
			return fmt.Errorf("header %d contains a NUL byte, which Postgres text cannot store", i)
		}
	}
	return nil
}

// Prepare returns a PreStash that stashes records one at a time in tx, for callers that write
// records one by one in a loop. It prepares nothing on the server: a named prepared statement
// outlives the transaction on its server connection, which a pooler in transaction mode then
// hands to other clients (who may prepare the same name), and is closed only after the commit,
// on whatever connection the pooler gives then. Each record is one simple INSERT, as with Stash.
// (Stash with many records at once is faster.)
func (s *Stasher) Prepare(ctx context.Context, tx *sql.Tx) (*PreStash, error) {
	return &PreStash{s: s, tx: tx}, nil
}

// PreStash stashes records one at a time in one transaction. It lives as long as its
// transaction.
type PreStash struct {
	s  *Stasher
	tx *sql.Tx
}

// Stash writes one record, as Stasher.Stash does.
func (p *PreStash) Stash(ctx context.Context, rec outbox.Record) error {
	if err := p.s.validate(rec); err != nil {
		return fmt.Errorf("stash record (key %q): %w", rec.KafkaKey, err)
	}
	if _, err := p.tx.ExecContext(ctx, p.s.insertSQL([]outbox.Record{rec})); err != nil {
		return fmt.Errorf("stash record into outbox: %w", err)
	}
	return nil
}

// Close does nothing; it is there for code written when PreStash held a prepared statement.
func (p *PreStash) Close() error { return nil }
