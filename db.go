package goharvest

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/neli"
	"github.com/goharvest/goharvest/outbox"
)

// KafkaHeader is one header of a Kafka message (see outbox.Header).
type KafkaHeader = outbox.Header

// KafkaHeaders are a message's headers, in order (see outbox.Headers).
type KafkaHeaders = outbox.Headers

// OutboxRecord is one row of the outbox table (see outbox.Record). The type lives in package
// outbox, which writers import without the harvester and its Kafka client.
type OutboxRecord = outbox.Record

// String returns a pointer to s, for OutboxRecord.KafkaValue.
func String(s string) *string { return &s }

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

// SchemaChecker is implemented by bindings that can check the outbox table's columns before
// publishing starts (PostgresBinding does). The harvester checks before every epoch.
type SchemaChecker interface {
	CheckSchema(ctx context.Context) error
}

// Listener is implemented by bindings that can tell the harvester when records are written
// (PostgresBinding does, with LISTEN/NOTIFY), so that an idle outbox need not be polled often.
// Polling remains the fallback: a notification only brings the next mark forward.
type Listener interface {
	// Listen calls wake whenever records may have been written, and once as soon as it is
	// listening, until ctx is done (then it returns nil) or it fails (then it returns the error
	// and the harvester calls it again after Limits.IOErrorBackoff). An error wrapping
	// ErrNotificationsLost says that notifications cannot arrive at all; the harvester then polls
	// and does not call Listen again until its next leader epoch.
	Listen(ctx context.Context, wake func()) error
}

// ErrNotificationsLost says that a Listener's LISTEN succeeded but notifications do not reach
// it, as behind a connection pooler in transaction mode.
// Sharder is implemented by bindings that can publish an outbox in shards (Config.Shards > 1).
type Sharder interface {
	// Shard returns a binding whose Mark (and MarkExcept, for a HeldRowBinding) returns only the
	// rows whose key is in shard of shards (outbox.Shard), and whose Backlog, for a
	// BacklogSampler, counts only those. Its Dispose must leave the parent usable.
	Shard(shard, shards int) DatabaseBinding
}

var ErrNotificationsLost = errors.New("notifications do not arrive")

// The Postgres binding offers every optional capability; checked here, so that renaming a method
// cannot silently turn a feature off.
var (
	_ DatabaseBinding = (*PostgresBinding)(nil)
	_ SchemaChecker   = (*PostgresBinding)(nil)
	_ Listener        = (*PostgresBinding)(nil)
	_ Pinger          = (*PostgresBinding)(nil)
	_ BacklogSampler  = (*PostgresBinding)(nil)
	_ HeldRowBinding  = (*PostgresBinding)(nil)
	_ Sharder         = (*PostgresBinding)(nil)
	_ Elector         = (*neli.Neli)(nil)
	_ Pinger          = (*neli.Neli)(nil)
	_ KafkaProducer   = (*confluentProducer)(nil)
)
