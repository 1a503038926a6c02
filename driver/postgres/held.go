package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/outbox"
)

// heldSQL holds the statements of the held-record machinery (internal/engine/epoch/held.go).
type heldSQL struct {
	markExcept, reread, purgeUnchanged, deadLetter, requeue string
}

func newHeldSQL(outboxTable string) heldSQL {
	table, _ := outbox.QuoteTable(outboxTable) // checked by the caller
	dead, _ := outbox.QuoteTable(outbox.DeadLetterTable(outboxTable))
	// A row's version is a hash of what would be published: an operator's fix changes it, a
	// harvester's mark (leader_id) does not, and it can be read through a view (which has no
	// xmin), such as the one docs/messages.md's recipe for Debezium-style tables makes.
	const version = `md5(row(kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)::text)`
	return heldSQL{
		markExcept: markStatement(table, ` AND kafka_key <> ALL($3)`, "id"),
		reread:     `SELECT ` + version + `, ` + outboxSelect + ` FROM ` + table + ` WHERE id = ANY($1)`,
		purgeUnchanged: `DELETE FROM ` + table + ` WHERE id = ANY($1)
  AND (id, ` + version + `) IN (SELECT * FROM unnest($1::bigint[], $2::text[])) RETURNING id`,
		// One statement is one transaction: the row leaves the outbox if and only if it reaches the
		// dead-letter table.
		deadLetter: `WITH moved AS (
  DELETE FROM ` + table + ` WHERE id = $1 AND ($2::text = '' OR ` + version + ` = $2::text) RETURNING *
)
INSERT INTO ` + dead + ` SELECT moved.*, $3::text, $4::integer, $5::timestamptz, $6::timestamptz FROM moved`,
		requeue: `WITH back AS (
  DELETE FROM ` + dead + ` WHERE id = $1
  RETURNING create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values
)
INSERT INTO ` + table + ` (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
SELECT * FROM back RETURNING id`,
	}
}

var _ driver.HeldRowBinding = (*Store)(nil)

// MarkExcept implements HeldRowBinding.
func (b *Store) MarkExcept(ctx context.Context, leaderID uuid.UUID, limit int, heldKeys []string) ([]driver.MarkedRecord, error) {
	if len(heldKeys) == 0 {
		return b.Mark(ctx, leaderID, limit)
	}
	// As bytes, so that the comparison holds for a bytea kafka_key too (whose text input would
	// read a key's backslashes as escapes) as well as a text one.
	keys := make([][]byte, len(heldKeys))
	for i, k := range heldKeys {
		keys[i] = []byte(k)
	}
	return b.claim(ctx, "mark outbox", b.held.markExcept, limit, leaderID, limit, keys)
}

// Reread implements HeldRowBinding.
func (b *Store) Reread(ctx context.Context, ids []int64) ([]driver.RereadRecord, error) {
	rows, err := b.pool.Query(ctx, b.held.reread, ids)
	if err != nil {
		return nil, fmt.Errorf("read held records: %w", err)
	}
	defer rows.Close()
	var out []driver.RereadRecord
	for rows.Next() {
		var r driver.RereadRecord
		if r.MarkedRecord, err = scanRecord(rows, &r.Version); err != nil {
			return nil, fmt.Errorf("read held records: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read held records: %w", err)
	}
	return out, nil
}

// PurgeUnchanged implements HeldRowBinding with one DELETE.
func (b *Store) PurgeUnchanged(ctx context.Context, versions map[int64]string) ([]int64, error) {
	ids := make([]int64, 0, len(versions))
	vs := make([]string, 0, len(versions))
	for id, v := range versions {
		ids = append(ids, id)
		vs = append(vs, v)
	}
	rows, err := b.pool.Query(ctx, b.held.purgeUnchanged, ids, vs)
	if err != nil {
		return nil, fmt.Errorf("purge outbox: %w", err)
	}
	purged, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, fmt.Errorf("purge outbox: %w", err)
	}
	return purged, nil
}

// DeadLetter implements HeldRowBinding.
func (b *Store) DeadLetter(ctx context.Context, id int64, version string, d driver.DeadLetterInfo) (bool, error) {
	tag, err := b.pool.Exec(ctx, b.held.deadLetter, id, version, d.Err, d.Attempts, d.FirstFailure, d.LastFailure)
	if err != nil {
		return false, fmt.Errorf("move record %d to the dead-letter table: %w", id, err)
	}
	return tag.RowsAffected() == 1, nil
}

// ErrNoSuchRecord says that no row has the given id.
var ErrNoSuchRecord = errors.New("no such record")

// DeadLetterNow moves the outbox row with the given id into the dead-letter table at once, as an
// operator asks (reaper dead-letter). A leader holding the row finds it gone within
// Limits.HeldCheckInterval, and releases its key; a record the leader is sending at that moment
// may still be published.
func DeadLetterNow(ctx context.Context, dataSource, outboxTable string, id int64, reason string) error {
	return withHeldSQL(ctx, dataSource, outboxTable, func(conn *pgx.Conn, q heldSQL) error {
		now := time.Now()
		tag, err := conn.Exec(ctx, q.deadLetter, id, "", reason, 0, now, now)
		if err != nil {
			return fmt.Errorf("move record %d to %s: %w", id, outbox.DeadLetterTable(outboxTable), err)
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("outbox record %d: %w", id, ErrNoSuchRecord)
		}
		return nil
	})
}

// Requeue moves the row with the given id from the dead-letter table back into the outbox, and
// returns its new id: it goes to the tail, behind every record written meanwhile, so it is
// published after its key's later records (see docs/monitoring.md, "When a row cannot be published").
func Requeue(ctx context.Context, dataSource, outboxTable string, id int64) (int64, error) {
	var newID int64
	err := withHeldSQL(ctx, dataSource, outboxTable, func(conn *pgx.Conn, q heldSQL) error {
		err := conn.QueryRow(ctx, q.requeue, id).Scan(&newID)
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("dead letter %d: %w", id, ErrNoSuchRecord)
		}
		if err != nil {
			return fmt.Errorf("requeue dead letter %d: %w", id, err)
		}
		return nil
	})
	return newID, err
}

func withHeldSQL(ctx context.Context, dataSource, outboxTable string, do func(*pgx.Conn, heldSQL) error) error {
	if _, err := outbox.QuoteTable(outboxTable); err != nil {
		return err
	}
	cfg, err := pgx.ParseConfig(dataSource)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if !execModeSet.MatchString(dataSource) {
		// As the binding does, so that reaper dead-letter and requeue work behind a pooler too.
		cfg.DefaultQueryExecMode = execMode
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(ctx)
	return do(conn, newHeldSQL(outboxTable))
}
