package driver

// What a store offers for a Postgres failover: whether its database is a standby, how far its
// standbys have come, and which server answers (see the root package's postgres_failover.go).

import (
	"context"
	"errors"
)

// ErrStandby says that the database is a standby (pg_is_in_recovery() is true) and accepts no
// writes.
var ErrStandby = errors.New("the database is a standby (pg_is_in_recovery() is true) and accepts no writes")

// ErrServerChanged says that statements of one epoch reached two different database servers:
// what the standbys of one hold says nothing about what the other did.
var ErrServerChanged = errors.New("the database server changed during the epoch (a failover?)")

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
// come (goharvest.Limits.AwaitStandbys).
type StandbyWaiter interface {
	// WALPosition returns the end of the WAL written so far: every transaction committed before
	// the call is before it.
	WALPosition(ctx context.Context) (WALPosition, error)
	// Standbys counts the standbys that hold pos. It fails with ErrServerChanged when it reaches
	// another server than pos's.
	Standbys(ctx context.Context, pos WALPosition) (StandbyCount, error)
}

// ServerIdentifier is implemented by bindings that can tell one database server from another,
// so that an epoch notices when its statements reach a new one (a failover the pool followed).
type ServerIdentifier interface {
	// Server returns what identifies the server that answers now.
	Server(ctx context.Context) (string, error)
}

// serverKey is the context key under which an epoch's purges carry the server they must run on
// (WithServer).
type serverKey struct{}

// WithServer has a purge (DatabaseBinding.Purge) delete only on server: on another, it deletes
// nothing and fails with ErrServerChanged. A pool can reach a promoted standby between two
// statements without an error, and there an id the epoch purges can name another row. The server
// travels in the context so that Purge keeps its signature; a binding that cannot tell servers
// apart (no ServerIdentifier) never sees one.
func WithServer(ctx context.Context, server string) context.Context {
	if server == "" {
		return ctx
	}
	return context.WithValue(ctx, serverKey{}, server)
}

// ServerOf returns the server WithServer put in ctx, if any.
func ServerOf(ctx context.Context) (string, bool) {
	server, ok := ctx.Value(serverKey{}).(string)
	return server, ok
}
