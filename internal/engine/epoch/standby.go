package epoch

// An epoch across a Postgres failover: it notices when its statements reach another server, and
// with Limits.AwaitStandbys it waits for standbys to hold what it marked and purged before it
// goes on (see the root package's postgres_failover.go for why).

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/goharvest/goharvest/driver"
)

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
func (p *Epoch) noteServer(ctx context.Context) {
	id := p.Features.Server
	if id == nil {
		return
	}
	if server, err := id.Server(ctx); err == nil {
		p.server.mu.Lock()
		p.server.server = server
		p.server.mu.Unlock()
	}
}

// sameServer reports whether server is the one the epoch has seen (or the first it sees).
func (p *Epoch) sameServer(server string) bool {
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
func (p *Epoch) serverChanged(ctx context.Context) bool {
	id := p.Features.Server
	if id == nil {
		return false
	}
	server, err := id.Server(ctx)
	if err != nil || p.sameServer(server) {
		return false
	}
	p.requestRemark("the database server changed (a failover?)", driver.ErrServerChanged)
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
func (p *Epoch) awaitStandbys(ctx context.Context) error {
	waiter := p.Features.Standbys
	if p.Limits.AwaitStandbys == 0 || waiter == nil {
		return nil
	}
	pos, err := waiter.WALPosition(ctx)
	if err != nil {
		return err
	}
	if !p.sameServer(pos.Server) {
		return driver.ErrServerChanged
	}
	poll, began, reported := time.Millisecond, time.Now(), time.Duration(0)
	for {
		count, err := waiter.Standbys(ctx, pos)
		if err != nil {
			return err
		}
		if count.Holding >= p.Limits.AwaitStandbys {
			if reported > 0 {
				p.DBTrouble.OK(p.Log)
			}
			return nil
		}
		if waited := time.Since(began); waited-reported >= p.Limits.IOErrorBackoff {
			reported = waited
			p.DBTrouble.Fail(p.Log, "await standbys", standbysBehind(p.Limits.AwaitStandbys, pos, count))
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
func (p *Epoch) standbysHold(ctx context.Context, op string) bool {
	err := p.awaitStandbys(ctx)
	switch {
	case err == nil:
		return true
	case ctx.Err() == nil:
		p.DBTrouble.Fail(p.Log, op, err)
		p.requestRemark(op+" failed", err)
	}
	return false
}

// standbysBehind says why a wait for standbys goes on.
func standbysBehind(want int, pos driver.WALPosition, c driver.StandbyCount) error {
	if c.Hidden > 0 && c.Hidden+c.Streaming >= want {
		return fmt.Errorf("awaitStandbys is %d, and pg_stat_replication hides the positions of %d standbys from this role: grant it pg_monitor", want, c.Hidden)
	}
	return fmt.Errorf("awaitStandbys is %d: %d standbys stream, %d of them have flushed WAL position %s", want, c.Streaming, c.Holding, pos.LSN)
}

// epochServerOf returns the server the epoch has seen, "" while it knows none.
func (p *Epoch) epochServerOf() string {
	p.server.mu.Lock()
	defer p.server.mu.Unlock()
	return p.server.server
}
