package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/goharvest/goharvest/driver"
)

// version is a row's version (see driver.RereadRecord): a hash of what would be published, which
// an operator's fix changes and a mark (leader_id) does not. Each column's length comes first,
// -1 for NULL, so that no two rows' columns run together into the same bytes.
const version = `MD5(CONCAT_WS(',',
  IFNULL(LENGTH(kafka_topic), -1), IFNULL(LENGTH(kafka_key), -1), IFNULL(LENGTH(kafka_value), -1),
  IFNULL(LENGTH(kafka_header_keys), -1), IFNULL(LENGTH(kafka_header_values), -1),
  CONCAT(IFNULL(kafka_topic, ''), IFNULL(kafka_key, ''), IFNULL(kafka_value, ''),
    IFNULL(kafka_header_keys, ''), IFNULL(kafka_header_values, ''))))`

// movedColumns are the columns a dead letter keeps of its outbox row, all but leader_id's
// meaning: the row as written, under its outbox id.
const movedColumns = `id, create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values, leader_id`

// Reread implements HeldRowBinding.
func (s *Store) Reread(ctx context.Context, ids []int64) ([]driver.RereadRecord, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.db.QueryContext(ctx, `SELECT `+version+`, `+outboxSelect+` FROM `+s.table+` WHERE id IN (`+idList(ids)+`)`)
	if err != nil {
		return nil, fmt.Errorf("read held records of %s: %w", s.name, err)
	}
	defer rows.Close()
	var out []driver.RereadRecord
	for rows.Next() {
		var r driver.RereadRecord
		if r.MarkedRecord, err = scan(rows, &r.Version); err != nil {
			return nil, fmt.Errorf("read held records of %s: %w", s.name, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read held records of %s: %w", s.name, err)
	}
	return out, nil
}

// PurgeUnchanged implements HeldRowBinding: in one transaction it locks the rows, keeps those
// still at their given version, and deletes them. (MySQL's DELETE returns no rows.)
func (s *Store) PurgeUnchanged(ctx context.Context, versions map[int64]string) ([]int64, error) {
	if len(versions) == 0 {
		return nil, nil
	}
	ids := make([]int64, 0, len(versions))
	for id := range versions {
		ids = append(ids, id)
	}
	var purged []int64
	err := s.inTx(ctx, func(tx *sql.Tx) error {
		current, err := lockVersions(ctx, tx, s.table, ids)
		if err != nil {
			return err
		}
		for id, v := range current {
			if versions[id] == v {
				purged = append(purged, id)
			}
		}
		if len(purged) == 0 {
			return nil
		}
		_, err = tx.ExecContext(ctx, `DELETE o FROM `+joinIDs(s.table, purged))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("purge outbox %s: %w", s.name, err)
	}
	slices.Sort(purged)
	return purged, nil
}

// lockVersions locks the rows with the given ids, for the rest of tx, and returns their versions.
func lockVersions(ctx context.Context, tx *sql.Tx, table string, ids []int64) (map[int64]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT id, `+version+` FROM `+joinIDs(table, ids)+` FOR UPDATE`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	versions := map[int64]string{}
	for rows.Next() {
		var (
			id int64
			v  string
		)
		if err := rows.Scan(&id, &v); err != nil {
			return nil, err
		}
		versions[id] = v
	}
	return versions, rows.Err()
}

// DeadLetter implements HeldRowBinding: in one transaction it locks the row, checks its version,
// copies it into the dead-letter table and deletes it, so that the row leaves the outbox if and
// only if it reaches the dead-letter table.
func (s *Store) DeadLetter(ctx context.Context, id int64, version string, d driver.DeadLetterInfo) (bool, error) {
	var moved bool
	err := s.inTx(ctx, func(tx *sql.Tx) (err error) {
		moved, err = s.moveToDeadLetters(ctx, tx, id, version, d)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("move record %d of %s to the dead-letter table: %w", id, s.name, err)
	}
	return moved, nil
}

// moveToDeadLetters is DeadLetter's transaction: any version will do when version is "".
func (s *Store) moveToDeadLetters(ctx context.Context, tx *sql.Tx, id int64, version string, d driver.DeadLetterInfo) (bool, error) {
	current, err := lockVersions(ctx, tx, s.table, []int64{id})
	if err != nil {
		return false, err
	}
	if v, ok := current[id]; !ok || version != "" && v != version {
		return false, nil
	}
	// The failure times are written as seconds since the epoch, as create_time is read, so that
	// the session's time zone does not move them.
	if _, err := tx.ExecContext(ctx, `INSERT INTO `+s.dead+` (`+movedColumns+`, error, attempts, first_failure_time, last_failure_time)
SELECT `+movedColumns+`, ?, ?, FROM_UNIXTIME(?), FROM_UNIXTIME(?) FROM `+s.table+` WHERE id = ?`,
		d.Err, d.Attempts, unixString(d.FirstFailure), unixString(d.LastFailure), id); err != nil {
		return false, err
	}
	if _, err := tx.ExecContext(ctx, `DELETE o FROM `+joinIDs(s.table, []int64{id})); err != nil {
		return false, err
	}
	return true, nil
}

// unixString writes t as seconds since the epoch, to the microsecond, for FROM_UNIXTIME.
func unixString(t time.Time) string {
	return fmt.Sprintf("%d.%06d", t.Unix(), t.Nanosecond()/1000)
}

// ErrNoSuchRecord says that no row has the given id.
var ErrNoSuchRecord = errors.New("no such record")

// DeadLetterNow moves the outbox row with the given id into the dead-letter table at once, as an
// operator asks (reaper dead-letter). A leader holding the row finds it gone within
// Limits.HeldCheckInterval, and releases its key; a record the leader is sending at that moment
// may still be published.
func DeadLetterNow(ctx context.Context, dataSource, outboxTable string, id int64, reason string) error {
	return withStore(dataSource, outboxTable, func(s *Store) error {
		now := time.Now()
		moved, err := s.DeadLetter(ctx, id, "", driver.DeadLetterInfo{Err: reason, FirstFailure: now, LastFailure: now})
		if err != nil {
			return err
		}
		if !moved {
			return fmt.Errorf("outbox record %d of %s: %w", id, outboxTable, ErrNoSuchRecord)
		}
		return nil
	})
}

// Requeue moves the row with the given id from the dead-letter table back into the outbox, and
// returns its new id: it goes to the tail, behind every record written meanwhile, so it is
// published after its key's later records (see docs/monitoring.md, "When a row cannot be
// published").
func Requeue(ctx context.Context, dataSource, outboxTable string, id int64) (int64, error) {
	var newID int64
	err := withStore(dataSource, outboxTable, func(s *Store) error {
		err := s.inTx(ctx, func(tx *sql.Tx) error {
			// Locked first, so that two operators cannot requeue one dead letter twice.
			var found int
			err := tx.QueryRowContext(ctx, `SELECT 1 FROM `+s.dead+` WHERE id = ? FOR UPDATE`, id).Scan(&found)
			if errors.Is(err, sql.ErrNoRows) {
				return fmt.Errorf("dead letter %d of %s: %w", id, outboxTable, ErrNoSuchRecord)
			}
			if err != nil {
				return err
			}
			const columns = `create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values`
			res, err := tx.ExecContext(ctx, `INSERT INTO `+s.table+` (`+columns+`) SELECT `+columns+` FROM `+s.dead+` WHERE id = ?`, id)
			if err != nil {
				return err
			}
			if newID, err = res.LastInsertId(); err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, `DELETE FROM `+s.dead+` WHERE id = ?`, id)
			return err
		})
		if err != nil && !errors.Is(err, ErrNoSuchRecord) {
			return fmt.Errorf("requeue dead letter %d of %s: %w", id, outboxTable, err)
		}
		return err
	})
	return newID, err
}

// withStore runs do on a store of its own, of one connection, for an operator's command.
func withStore(dataSource, outboxTable string, do func(*Store) error) error {
	s, err := New(dataSource, outboxTable, WithMaxOpenConns(1))
	if err != nil {
		return err
	}
	defer s.Dispose()
	return do(s)
}

var _ driver.HeldRowBinding = (*Store)(nil)
