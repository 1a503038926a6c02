package postgres

import (
	"context"
	"fmt"

	"github.com/goharvest/goharvest/driver"
)

// What the harvester does about a Postgres failover: a standby promoted when its primary fails.
//
// Through a data source that names every host with target_session_attrs=read-write (or an
// address that a failover manager moves), the pool's broken connections are dropped and new ones
// reach the promoted standby; an epoch whose statements fail ends and a new one marks afresh,
// without a restart. Two things a failover can break are dealt with here:
//
//   - A harvester pointed at a standby cannot write. It says so, stays out of the leader election
//     (so that a harvester that can write leads), and joins once its database accepts writes
//     (awaitPrimary).
//   - With asynchronous replication the promoted standby may lack what the old primary committed
//     last. Purges it lacks bring back records already published; if a key's next record was
//     published too, consumers see A B A B. Limits.AwaitStandbys makes the epoch wait until that
//     many standbys hold a mark before its records are sent, and a purge before its keys' next
//     records are (standbyWait): a promoted standby then lacks no purge whose key moved on, and
//     no row that was published (so it cannot give a published record's id to a new row).

// InRecovery implements RecoveryChecker.
func (b *Store) InRecovery(ctx context.Context) (bool, error) {
	var standby bool
	if err := b.pool.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil {
		return false, fmt.Errorf("ask whether the database is a standby: %w", err)
	}
	return standby, nil
}

// WALPosition implements StandbyWaiter. It takes the insert position rather than the flushed
// one, which may be behind a commit made with synchronous_commit off.
func (b *Store) WALPosition(ctx context.Context) (driver.WALPosition, error) {
	var pos driver.WALPosition
	err := b.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text, pg_postmaster_start_time()::text").Scan(&pos.LSN, &pos.Server)
	if err != nil {
		return driver.WALPosition{}, fmt.Errorf("read the WAL position: %w", err)
	}
	return pos, nil
}

// standbysSQL counts the standbys that have flushed WAL up to $1. A promoted standby replays all
// the WAL it flushed before it accepts writes, so flushed is enough, and a standby reports a
// flush at once (its replay only with its next reply, up to wal_receiver_status_interval later).
// The insert position can sit just past a page header that nothing follows yet: a standby that
// has flushed all the primary has, no more than a header short of it, holds everything too.
const standbysSQL = `WITH p AS (SELECT pg_current_wal_insert_lsn() AS inserted, pg_current_wal_flush_lsn() AS flushed)
SELECT count(*) FILTER (WHERE r.flush_lsn >= $1::pg_lsn
         OR (p.inserted = $1::pg_lsn AND r.flush_lsn >= p.flushed AND $1::pg_lsn - p.flushed <= 40)),
       count(*) FILTER (WHERE r.state = 'streaming'),
       count(*) FILTER (WHERE r.pid IS NOT NULL AND r.state IS NULL),
       pg_postmaster_start_time()::text
FROM p LEFT JOIN pg_stat_replication r ON true
GROUP BY 4`

// Standbys implements StandbyWaiter from pg_stat_replication, whose positions only a role with
// pg_monitor (or pg_read_all_stats) sees for standbys that connect as another role.
func (b *Store) Standbys(ctx context.Context, pos driver.WALPosition) (driver.StandbyCount, error) {
	var (
		c      driver.StandbyCount
		server string
	)
	if err := b.pool.QueryRow(ctx, standbysSQL, pos.LSN).Scan(&c.Holding, &c.Streaming, &c.Hidden, &server); err != nil {
		return driver.StandbyCount{}, fmt.Errorf("read pg_stat_replication: %w", err)
	}
	if server != pos.Server {
		return driver.StandbyCount{}, driver.ErrServerChanged
	}
	return c, nil
}

// Server implements ServerIdentifier with the postmaster's start time: a promoted standby was
// started at another time than its primary, and a restarted server at another than before.
func (b *Store) Server(ctx context.Context) (string, error) {
	var server string
	if err := b.pool.QueryRow(ctx, "SELECT pg_postmaster_start_time()::text").Scan(&server); err != nil {
		return "", fmt.Errorf("identify the database server: %w", err)
	}
	return server, nil
}

// purgeOn is Purge's DELETE, made on server only, in one statement.
func (b *Store) purgeOn(ctx context.Context, server string, ids []int64) (int, error) {
	var (
		same   bool
		purged int
	)
	err := b.pool.QueryRow(ctx, `WITH s AS (SELECT pg_postmaster_start_time()::text = $2 AS same),
  d AS (DELETE FROM `+b.table+` WHERE id = ANY($1) AND (SELECT same FROM s) RETURNING 1)
SELECT (SELECT same FROM s), (SELECT count(*) FROM d)`, ids, server).Scan(&same, &purged)
	switch {
	case err != nil:
		return 0, fmt.Errorf("purge outbox: %w", err)
	case !same:
		return 0, fmt.Errorf("purge outbox: %w", driver.ErrServerChanged)
	}
	return purged, nil
}
