package goharvest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
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

// ErrStandby says that the database is a standby (pg_is_in_recovery() is true) and accepts no
// writes.
var ErrStandby = errors.New("the database is a standby (pg_is_in_recovery() is true) and accepts no writes")

// errServerChanged says that statements of one epoch reached two different database servers:
// what the standbys of one hold says nothing about what the other did.
var errServerChanged = errors.New("the database server changed during the epoch (a failover?)")

// RecoveryChecker is implemented by bindings that can tell whether their database is a standby.
type RecoveryChecker interface {
	InRecovery(ctx context.Context) (bool, error)
}

// WALPosition is a point in a database server's write-ahead log, and the server it belongs to.
type WALPosition struct {
	LSN    string // as Postgres writes a pg_lsn: "0/1A2B3C"
	Server string // tells one server from another (its postmaster's start time)
}

// StandbyCount is what a primary's pg_stat_replication says about its standbys.
type StandbyCount struct {
	Holding   int // standbys that have flushed the WAL up to the position asked about
	Streaming int // standbys streaming now
	Hidden    int // standbys whose positions the role may not see (it lacks pg_monitor)
}

// StandbyWaiter is implemented by bindings whose database can tell how far its standbys have
// come (Limits.AwaitStandbys).
type StandbyWaiter interface {
	// WALPosition returns the end of the WAL written so far: every transaction committed before
	// the call is before it.
	WALPosition(ctx context.Context) (WALPosition, error)
	// Standbys counts the standbys that hold pos. It fails with errServerChanged when it reaches
	// another server than pos's.
	Standbys(ctx context.Context, pos WALPosition) (StandbyCount, error)
}

// InRecovery implements RecoveryChecker.
func (b *PostgresBinding) InRecovery(ctx context.Context) (bool, error) {
	var standby bool
	if err := b.pool.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&standby); err != nil {
		return false, fmt.Errorf("ask whether the database is a standby: %w", err)
	}
	return standby, nil
}

// WALPosition implements StandbyWaiter. It takes the insert position rather than the flushed
// one, which may be behind a commit made with synchronous_commit off.
func (b *PostgresBinding) WALPosition(ctx context.Context) (WALPosition, error) {
	var pos WALPosition
	err := b.pool.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text, pg_postmaster_start_time()::text").Scan(&pos.LSN, &pos.Server)
	if err != nil {
		return WALPosition{}, fmt.Errorf("read the WAL position: %w", err)
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
func (b *PostgresBinding) Standbys(ctx context.Context, pos WALPosition) (StandbyCount, error) {
	var (
		c      StandbyCount
		server string
	)
	if err := b.pool.QueryRow(ctx, standbysSQL, pos.LSN).Scan(&c.Holding, &c.Streaming, &c.Hidden, &server); err != nil {
		return StandbyCount{}, fmt.Errorf("read pg_stat_replication: %w", err)
	}
	if server != pos.Server {
		return StandbyCount{}, errServerChanged
	}
	return c, nil
}

// ServerIdentifier is implemented by bindings that can tell one database server from another,
// so that an epoch notices when its statements reach a new one (a failover the pool followed).
type ServerIdentifier interface {
	// Server returns what identifies the server that answers now.
	Server(ctx context.Context) (string, error)
}

// Server implements ServerIdentifier with the postmaster's start time: a promoted standby was
// started at another time than its primary, and a restarted server at another than before.
func (b *PostgresBinding) Server(ctx context.Context) (string, error) {
	var server string
	if err := b.pool.QueryRow(ctx, "SELECT pg_postmaster_start_time()::text").Scan(&server); err != nil {
		return "", fmt.Errorf("identify the database server: %w", err)
	}
	return server, nil
}

// epochServer is the database server an epoch has seen (guarded by mu; "" before it knows).
// An epoch must not outlive a failover: rows of the promoted database can carry ids that this
// epoch has purged already (a standby that lacked the old primary's last inserts hands their ids
// out again), and a worker takes such a row for a stale copy of a purged record and never sends
// it. A new epoch starts afresh.
type epochServer struct {
	mu     sync.Mutex
	server string
}

// noteServer records which server the epoch starts on.
func (p *pipeline) noteServer(ctx context.Context) {
	id, ok := p.db.(ServerIdentifier)
	if !ok {
		return
	}
	if server, err := id.Server(ctx); err == nil {
		p.server.mu.Lock()
		p.server.server = server
		p.server.mu.Unlock()
	}
}

// sameServer reports whether server is the one the epoch has seen (or the first it sees).
func (p *pipeline) sameServer(server string) bool {
	p.server.mu.Lock()
	defer p.server.mu.Unlock()
	if p.server.server == "" {
		p.server.server = server
	}
	return p.server.server == server
}

// serverChanged reports whether the database answers from another server than the epoch has
// seen, and then asks for a remark. A database that does not answer has not changed, as far as
// it can tell: the statement about to be retried fails too.
func (p *pipeline) serverChanged(ctx context.Context) bool {
	id, ok := p.db.(ServerIdentifier)
	if !ok {
		return false
	}
	server, err := id.Server(ctx)
	if err != nil || p.sameServer(server) {
		return false
	}
	p.requestRemark("the database server changed (a failover?)", errServerChanged)
	return true
}

// maxStandbyPoll bounds the time between two looks at pg_stat_replication while waiting.
const maxStandbyPoll = 50 * time.Millisecond

// awaitStandbys waits until Limits.AwaitStandbys standbys hold everything the database has
// committed so far, and returns nil at once when the setting is off or the binding cannot tell.
// While it waits longer than IOErrorBackoff, the database counts as unavailable (the log and
// Ready say why). It returns ctx's error when ctx ends first, and any other error when the
// database fails or turns out to be another server than at the epoch's last wait: the caller
// then ends the epoch, since what it did may not be on the standby now promoted.
func (p *pipeline) awaitStandbys(ctx context.Context) error {
	waiter, ok := p.db.(StandbyWaiter)
	if p.limits.AwaitStandbys == 0 || !ok {
		return nil
	}
	pos, err := waiter.WALPosition(ctx)
	if err != nil {
		return err
	}
	if !p.sameServer(pos.Server) {
		return errServerChanged
	}
	poll, began, reported := time.Millisecond, time.Now(), time.Duration(0)
	for {
		count, err := waiter.Standbys(ctx, pos)
		if err != nil {
			return err
		}
		if count.Holding >= p.limits.AwaitStandbys {
			if reported > 0 {
				p.dbTrouble.OK(p.log)
			}
			return nil
		}
		if waited := time.Since(began); waited-reported >= p.limits.IOErrorBackoff {
			reported = waited
			p.dbTrouble.Fail(p.log, "await standbys", standbysBehind(p.limits.AwaitStandbys, pos, count))
		}
		select {
		case <-time.After(poll):
		case <-ctx.Done():
			return ctx.Err()
		}
		poll = min(2*poll, maxStandbyPoll)
	}
}

// standbysHold runs awaitStandbys and reports whether the epoch may go on: false when ctx
// ended, and when the wait failed, which asks for a remark (op names the step for the log).
func (p *pipeline) standbysHold(ctx context.Context, op string) bool {
	err := p.awaitStandbys(ctx)
	switch {
	case err == nil:
		return true
	case ctx.Err() == nil:
		p.dbTrouble.Fail(p.log, op, err)
		p.requestRemark(op+" failed", err)
	}
	return false
}

// standbysBehind says why a wait for standbys goes on.
func standbysBehind(want int, pos WALPosition, c StandbyCount) error {
	if c.Hidden > 0 && c.Hidden+c.Streaming >= want {
		return fmt.Errorf("awaitStandbys is %d, and pg_stat_replication hides the positions of %d standbys from this role: grant it pg_monitor", want, c.Hidden)
	}
	return fmt.Errorf("awaitStandbys is %d: %d standbys stream, %d of them have flushed WAL position %s", want, c.Streaming, c.Holding, pos.LSN)
}

// awaitPrimary keeps a harvester whose database is a standby out of the leader election, so
// that one whose database accepts writes leads, and lets it join once its database does (after a
// promotion, or once a multi-host data source reaches the primary). A database that does not
// answer is no reason to wait: the harvester joins, as it always has, and Ready reports the
// database. It returns false when Stop was called meanwhile. It runs on the owner goroutine,
// before the first pulse, and keeps the loop's pulse fresh for Healthy.
func (h *Harvest) awaitPrimary() bool {
	checker, ok := h.db.(RecoveryChecker)
	if !ok {
		return true
	}
	tick := time.NewTicker(h.cfg.Limits.MinPollInterval)
	defer tick.Stop()
	var checked time.Time
	for {
		if time.Since(checked) >= standbyRecheck {
			checked = time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), h.cfg.Limits.MaxPollInterval)
			standby, err := checker.InRecovery(ctx)
			cancel()
			if err != nil || !standby {
				if h.onStandby.Swap(false) {
					h.log.Info("the database accepts writes now; joining the leader election")
				}
				return true
			}
			if !h.onStandby.Swap(true) {
				h.log.Error("the database is a standby (pg_is_in_recovery() is true): not joining the leader election until it accepts writes; " +
					"point dataSource at the primary, or name every host with target_session_attrs=read-write")
			}
		}
		h.lastPulse.Store(time.Now().UnixNano())
		select {
		case <-h.stopCh:
			return false
		case <-tick.C:
		}
	}
}

// standbyRecheck is how often a harvester kept out of the election asks whether its database
// accepts writes yet.
const standbyRecheck = time.Second

// serverKey is the context key under which an epoch's purges carry the server they must run on
// (withServer).
type serverKey struct{}

// withServer has PostgresBinding.Purge delete only on server: on another, it deletes nothing and
// fails with errServerChanged. A pool can reach a promoted standby between two statements without
// an error, and there an id the epoch purges can name another row.
func withServer(ctx context.Context, server string) context.Context {
	if server == "" {
		return ctx
	}
	return context.WithValue(ctx, serverKey{}, server)
}

// purgeOn is Purge's DELETE, made on server only, in one statement.
func (b *PostgresBinding) purgeOn(ctx context.Context, server string, ids []int64) (int, error) {
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
		return 0, fmt.Errorf("purge outbox: %w", errServerChanged)
	}
	return purged, nil
}

// epochServerOf returns the server the epoch has seen, "" while it knows none.
func (p *pipeline) epochServerOf() string {
	p.server.mu.Lock()
	defer p.server.mu.Unlock()
	return p.server.server
}
