// Package mysqlstasher writes outbox records inside the caller's MySQL or MariaDB transaction, so
// that a message is published if and only if the business data written with it commits: package
// stasher's shape (New, Stash, Prepare) for the outbox that driver/mysql publishes.
//
// It works with a *sql.Tx from any database/sql driver (go-sql-driver/mysql, in pure Go) and
// never commits or rolls back: the transaction belongs to the caller. It imports no database
// driver and nothing of the harvester.
package mysqlstasher

import (
	"context"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/goharvest/goharvest/outbox"
)

// rowsPerStatement bounds one INSERT, so that a statement stays well within max_allowed_packet
// for ordinary records.
const rowsPerStatement = 1000

// SQLExecer is what Stash needs of a database/sql transaction. *sql.Tx satisfies it (as do
// *sql.Conn and *sql.DB, which stash outside any transaction of the caller's).
type SQLExecer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Stasher writes records to one outbox table. It is safe for concurrent use.
type Stasher struct {
	table string // quoted
}

// New returns a Stasher for the named outbox table ("outbox", or database-qualified
// "shop.outbox"; quoted as written), as mysql.CreateOutboxTable makes it.
func New(outboxTable string) (*Stasher, error) {
	table, err := outbox.QuoteTableMySQL(outboxTable)
	if err != nil {
		return nil, fmt.Errorf("stasher: %w", err)
	}
	return &Stasher{table: table}, nil
}

// Stash writes records to the outbox in tx, in the given order, using as few INSERT statements
// as it can (one per thousand records). Records are checked first: if any is invalid, nothing
// is written and the error names the record. A record's CreateTime defaults to the database's
// NOW(6); its ID and LeaderID are ignored.
//
// The values travel in the statement as literals, not as parameters, so that the statement is
// one round trip whatever the driver's settings (go-sql-driver prepares a statement with
// parameters on the server unless told to interpolate them). Keys, values and headers are
// written as hexadecimal literals, which any bytes survive and whose meaning depends on no
// sql_mode (NO_BACKSLASH_ESCAPES) nor character set.
func (s *Stasher) Stash(ctx context.Context, tx SQLExecer, records ...outbox.Record) error {
	for i := range records {
		if err := validate(records[i]); err != nil {
			return fmt.Errorf("stash record %d (key %q): %w", i, records[i].KafkaKey, err)
		}
	}
	for start := 0; start < len(records); start += rowsPerStatement {
		chunk := records[start:min(start+rowsPerStatement, len(records))]
		if _, err := tx.ExecContext(ctx, s.insertSQL(chunk)); err != nil {
			return fmt.Errorf("stash %d records into outbox %s: %w", len(chunk), s.table, err)
		}
	}
	return nil
}

// insertSQL builds an INSERT of the records, each value a literal.
func (s *Stasher) insertSQL(records []outbox.Record) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + s.table +
		" (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values) VALUES ")
	for i, rec := range records {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		writeTime(&b, rec.CreateTime)
		b.WriteString(", ")
		writeText(&b, rec.KafkaTopic)
		b.WriteString(", ")
		writeBytes(&b, rec.KafkaKey)
		b.WriteString(", ")
		if rec.KafkaValue == nil {
			b.WriteString("NULL")
		} else {
			writeBytes(&b, *rec.KafkaValue)
		}
		keys, values := make([]string, len(rec.KafkaHeaders)), make([]string, len(rec.KafkaHeaders))
		for j, h := range rec.KafkaHeaders {
			keys[j], values[j] = h.Key, h.Value
		}
		b.WriteString(", ")
		writeJSON(&b, keys)
		b.WriteString(", ")
		writeJSON(&b, values)
		b.WriteByte(')')
	}
	return b.String()
}

// writeTime writes t as seconds since the epoch for FROM_UNIXTIME, to the microsecond, or NOW(6)
// for the zero time. (FROM_UNIXTIME gives the session's local time, which the TIMESTAMP column
// turns back into the instant; a session whose time zone has summer time cannot tell the two
// instants of its repeated hour apart, so give writers' sessions time_zone = '+00:00' if their
// records carry their own times.)
func writeTime(b *strings.Builder, t time.Time) {
	if t.IsZero() {
		b.WriteString("NOW(6)")
		return
	}
	fmt.Fprintf(b, "FROM_UNIXTIME(%d.%06d)", t.Unix(), t.Nanosecond()/1000)
}

// writeBytes writes s as a binary string, byte for byte, the empty string included.
func writeBytes(b *strings.Builder, s string) {
	b.WriteString("X'")
	b.WriteString(hex.EncodeToString([]byte(s)))
	b.WriteByte('\'')
}

// writeText writes UTF-8 text: its bytes converted to utf8mb4, which a JSON column of MySQL takes
// (it refuses a binary string) as well as a text one.
func writeText(b *strings.Builder, s string) {
	b.WriteString("CONVERT(")
	writeBytes(b, s)
	b.WriteString(" USING utf8mb4)")
}

// writeJSON writes strings as a JSON array.
func writeJSON(b *strings.Builder, ss []string) {
	array, _ := json.Marshal(ss) // strings always marshal
	writeText(b, string(array))
}

func validate(rec outbox.Record) error {
	if err := outbox.CheckName(rec.KafkaTopic); err != nil {
		return fmt.Errorf("kafka topic %s is not a valid topic name: %w", strconv.Quote(rec.KafkaTopic), err)
	}
	// Headers are JSON strings, which hold text: JSON would replace invalid UTF-8 silently.
	for i, h := range rec.KafkaHeaders {
		if !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
			return fmt.Errorf("header %d is not UTF-8 text, which the JSON header columns hold", i)
		}
	}
	return nil
}

// Prepare returns a PreStash that stashes records one at a time in tx, for callers that write
// records one by one in a loop, as package stasher's does. It prepares nothing on the server.
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
	return p.s.Stash(ctx, p.tx, rec)
}

// Close does nothing; it is there so that code written for package stasher's PreStash fits.
func (p *PreStash) Close() error { return nil }
