package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/outbox"
)

// OutboxRecord is one row of the outbox table (see outbox.Record). MarkedRecord embeds it under
// this name, which is the name of its field.
type OutboxRecord = outbox.Record

// MarkedRecord is a record returned by DatabaseBinding.Mark. A row that cannot be turned into a
// message (say its header arrays differ in length) is still marked and returned in its place,
// with Err set and whatever fields could be read, so that the harvester can report it by ID and
// hold back its key rather than crash or drop it.
type MarkedRecord struct {
	OutboxRecord
	// Err is a *RecordError when the row is malformed; such a record must not be published.
	Err error
}

// RecordError says that the outbox row with the given ID cannot be published as it stands.
type RecordError struct {
	ID     int64
	Reason string
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("outbox record %d: %s", e.ID, e.Reason)
}

// DatabaseBinding is the harvester's access to the outbox table. Every method may be called
// from several goroutines at once. Implementations must check every result and rows error: a
// statement that silently fails would lose or duplicate messages.
type DatabaseBinding interface {
	// Mark atomically sets leader_id to leaderID on up to limit of the oldest rows whose
	// leader_id is NULL or different from leaderID, and returns them sorted by ID. Rows this
	// leader has marked already are skipped; rows marked by any other leader ID are taken over.
	Mark(ctx context.Context, leaderID uuid.UUID, limit int) ([]MarkedRecord, error)

	// Purge deletes the rows with the given IDs, once Kafka has acknowledged them, and returns
	// how many it deleted. IDs that no longer exist are ignored.
	Purge(ctx context.Context, ids []int64) (int, error)

	// Reset clears leader_id on those of the given rows that leaderID still holds, so that they
	// are marked again, and returns how many it cleared. A row that another leader has taken over
	// since is left alone.
	Reset(ctx context.Context, leaderID uuid.UUID, ids []int64) (int, error)

	// Dispose releases the binding's connections. It is called once, after the last call to the
	// other methods has returned.
	Dispose()
}

// HeldRowBinding is what the harvester needs of a binding to hold back a record that cannot be
// published (see the top of internal/engine/epoch/held.go): to leave its key's other rows alone, to read
// it afresh before sending it again, to purge it only while its row is unchanged, and to move it
// into the dead-letter table. Without it, a held record could be sent again with content that
// was never read again, so every binding must have it (see Store).
type HeldRowBinding interface {
	// MarkExcept is Mark, leaving alone the rows whose kafka_key is one of heldKeys.
	MarkExcept(ctx context.Context, leaderID uuid.UUID, limit int, heldKeys []string) ([]MarkedRecord, error)
	// Reread reads the rows with the given ids afresh, with their versions; rows that no longer
	// exist are missing from the result.
	Reread(ctx context.Context, ids []int64) ([]RereadRecord, error)
	// PurgeUnchanged deletes each row whose version is still the given one, and returns the ids
	// it deleted.
	PurgeUnchanged(ctx context.Context, versions map[int64]string) ([]int64, error)
	// DeadLetter moves the row with the given id, if its version is still version, from the
	// outbox into the dead-letter table (see goharvest.DeadLetterTable) in one transaction, and
	// reports whether it did.
	DeadLetter(ctx context.Context, id int64, version string, d DeadLetterInfo) (bool, error)
}

// RereadRecord is a row read afresh, with its version: a value that changes whenever the row is
// updated (a hash of the columns that make the message).
type RereadRecord struct {
	MarkedRecord
	Version string
}

// DeadLetterInfo is what the dead-letter table records about a row besides its columns.
type DeadLetterInfo struct {
	Err          string
	Attempts     int
	FirstFailure time.Time
	LastFailure  time.Time
}

// Store is everything the engine requires of the outbox: each method carries correctness. The
// root package checks that the binding a DatabaseBindingProvider returns is one, and refuses to
// start with a binding that is not.
type Store interface {
	DatabaseBinding
	HeldRowBinding
}

// Reader is implemented by stores that can read rows without claiming them, for the read
// strategy (internal/engine/epoch/claim_read.go), which writes nothing to a row but its purge.
type Reader interface {
	// Read returns the oldest rows, up to limit, in id order, leaving out the rows whose id is in
	// exclude or whose kafka_key is in heldKeys. It changes nothing. A malformed row comes back as
	// Mark returns it (with Err set).
	Read(ctx context.Context, limit int, heldKeys []string, exclude []int64) ([]MarkedRecord, error)
}

// SchemaChecker is implemented by bindings that can check the outbox table's columns before
// publishing starts (the Postgres store does). The harvester checks before every epoch.
type SchemaChecker interface {
	CheckSchema(ctx context.Context) error
}

// SchemaError says that the outbox table lacks a column the harvester needs, or has one of a
// type it cannot read. Retrying does not help until the table is altered.
type SchemaError struct {
	Table    string
	Problems []string
}

func (e *SchemaError) Error() string {
	return fmt.Sprintf("outbox table %s: %s", e.Table, strings.Join(e.Problems, "; "))
}

// Column is a column of the outbox table that a store reads, with the types it can read it as,
// named as its database's catalog names them.
type Column struct {
	Name  string
	Types []string
}

// CheckColumns compares a table's columns, as its catalog gives them (column name to type), with
// the columns a store reads, and returns a *SchemaError naming each column missing and each of a
// type the store cannot read, or nil: the part of SchemaChecker that does not depend on the
// database.
func CheckColumns(table string, have map[string]string, want []Column) error {
	var problems []string
	for _, col := range want {
		got, ok := have[col.Name]
		switch {
		case !ok:
			problems = append(problems, "column "+col.Name+" is missing")
		case !slices.Contains(col.Types, got):
			problems = append(problems, fmt.Sprintf("column %s has type %s; goharvest reads it as %s",
				col.Name, got, strings.Join(col.Types, " or ")))
		}
	}
	if len(problems) > 0 {
		return &SchemaError{Table: table, Problems: problems}
	}
	return nil
}

// Listener is implemented by bindings that can tell the harvester when records are written
// (the Postgres store does, with LISTEN/NOTIFY), so that an idle outbox need not be polled often.
// Polling remains the fallback: a notification only brings the next mark forward.
type Listener interface {
	// Listen calls wake whenever records may have been written, and once as soon as it is
	// listening, until ctx is done (then it returns nil) or it fails (then it returns the error
	// and the harvester calls it again after Limits.IOErrorBackoff). An error wrapping
	// ErrNotificationsLost says that notifications cannot arrive at all; the harvester then polls
	// and does not call Listen again until its next leader epoch.
	Listen(ctx context.Context, wake func()) error
}

// CoveringListener is a Listener that can also tell when its notifications cover every write of
// records: it is listening, its connection answers (asked at least every minute), and the outbox
// notifies on every insert (a trigger). While they do, the harvester does not poll an idle outbox
// at all: it claims again only when woken, so that an idle outbox makes no queries (see
// Limits.MaxMarkBackoff for the polling otherwise).
type CoveringListener interface {
	Listener
	// ListenCovering is Listen, and also calls covered(true) when it knows that every record
	// written will wake it, and covered(false) as soon as it no longer knows that, and before it
	// returns. It calls covered from one goroutine, never at once with wake.
	ListenCovering(ctx context.Context, wake func(), covered func(bool)) error
}

// ErrNotificationsLost says that a Listener's LISTEN succeeded but notifications do not reach
// it, as behind a connection pooler in transaction mode.
var ErrNotificationsLost = errors.New("notifications do not arrive")

// Sharder is implemented by bindings that can publish an outbox in shards (Config.Shards > 1).
type Sharder interface {
	// Shard returns a binding whose Mark (and MarkExcept) returns only the rows whose key is in
	// shard of shards (outbox.Shard), and whose Backlog, for a BacklogSampler, counts only
	// those. It offers the same features as its parent. Its Dispose must leave the parent usable.
	Shard(shard, shards int) DatabaseBinding
}

// Pinger is implemented by bindings and electors that can check their connection.
type Pinger interface {
	Ping(ctx context.Context) error
}

// BacklogSampler is implemented by bindings that can count the outbox's backlog cheaply.
type BacklogSampler interface {
	// Backlog returns how many records the outbox holds (counting stops at limit) and the
	// creation time of the oldest, zero when empty.
	Backlog(ctx context.Context, limit int) (int, time.Time, error)
}

// Features are a store's optional capabilities: each is nil when the store lacks it. They are
// found once, by FeaturesOf, rather than asserted wherever they are used, so that what a store
// offers is decided in one place and cannot differ from one use to the next.
type Features struct {
	// Schema checks the table before each epoch; nil: not checked.
	Schema SchemaChecker
	// Listen wakes the marker when rows are written; nil: the marker polls.
	Listen Listener
	// Covering says when Listen's wake-ups cover every write, so that the marker need not poll;
	// nil: it polls an idle outbox every Limits.MaxMarkBackoff.
	Covering CoveringListener
	// Ping answers readiness; nil: readiness does not ask the store.
	Ping Pinger
	// Backlog counts the backlog for the metrics; nil: not counted.
	Backlog BacklogSampler
	// Shards splits the outbox into shards; nil: one shard only.
	Shards Sharder
	// Read reads rows without claiming them; nil: epochs claim by marking (MarkClaim).
	Read Reader
	// Recovery tells whether the database is a standby; nil: taken to be a primary.
	Recovery RecoveryChecker
	// Standbys tells how far the standbys have come; nil: Limits.AwaitStandbys has no effect.
	Standbys StandbyWaiter
	// Server tells which database server answers; nil: a failover is noticed only by errors.
	Server ServerIdentifier
}

// FeaturesOf returns what the store offers besides Store.
func FeaturesOf(s Store) Features {
	var f Features
	f.Schema, _ = s.(SchemaChecker)
	f.Listen, _ = s.(Listener)
	f.Covering, _ = s.(CoveringListener)
	f.Ping, _ = s.(Pinger)
	f.Backlog, _ = s.(BacklogSampler)
	f.Shards, _ = s.(Sharder)
	f.Read, _ = s.(Reader)
	f.Recovery, _ = s.(RecoveryChecker)
	f.Standbys, _ = s.(StandbyWaiter)
	f.Server, _ = s.(ServerIdentifier)
	return f
}

// AsStore returns db as a Store, or an error that names what it lacks.
func AsStore(db DatabaseBinding) (Store, error) {
	s, ok := db.(Store)
	if !ok {
		return nil, fmt.Errorf("the database binding (%T) does not implement HeldRowBinding (MarkExcept, Reread, PurgeUnchanged, DeadLetter), which the harvester needs to hold back a record that cannot be published without resending content it never read again; a wrapper must pass those methods on too", db)
	}
	return s, nil
}
