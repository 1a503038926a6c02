package epoch

import (
	"context"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/driver"
)

// Claimer is how an epoch claims the rows it publishes next: a strategy. The marker calls Claim
// while the pipeline has room; the pipeline calls Release for records the epoch gives up on, and
// Finished for records whose rows are gone. Another strategy is one new file with a type that
// implements these methods, and a constructor the owner can choose (see MarkClaim and ReadClaim).
//
// What belongs to a strategy:
//   - What claiming writes, if anything, and so what a claim left behind when an epoch ends.
//   - What a failed Claim means. When its reply can be lost after it took effect (the mark
//     UPDATE commits, and the connection drops before the rows come back), rows may be claimed
//     that this epoch will never see; FailedClaimEndsEpoch then says so, and the marker ends the
//     epoch, so that a new one, under a new leader ID, claims them again. Otherwise the marker
//     backs off and claims again.
//   - How Release gives records back, so that a later claim returns them.
//
// What holds for every strategy, enforced by the pipeline rather than by the strategy:
//   - Claim returns rows in id order, and never a row of a held key (heldKeys); the marker hands
//     them to their keys' workers in that order, which is the order a key's records are sent in.
//   - A key's next record is not sent until the previous one is purged, so a claim that returns
//     a key's rows again (a deposed leader's claim crossing this one) cannot reorder the key.
//   - A copy of a record that is already queued is dropped, and so is a copy returned by a claim
//     that began before its record's purge committed (sendWorker.wasPurged): claims are numbered
//     (budget.reserve), and a purge notes the number of the latest claim begun.
//   - A row is purged only once Kafka has committed its record; a record whose row was read
//     afresh is purged only while the row is the version read (held.go).
//   - A new epoch's InitTransactions fences every earlier producer of the shard before it claims
//     anything, and it first purges what the previous epochs' notes list (note.go).
type Claimer interface {
	// Claim returns up to limit of the next rows to publish, in id order, none of whose key is
	// in heldKeys.
	Claim(ctx context.Context, limit int, heldKeys []string) ([]driver.MarkedRecord, error)
	// Release gives back rows this epoch claimed and will not publish, so that a later claim
	// returns them again.
	Release(ctx context.Context, ids []int64) error
	// Finished says that these records have left the epoch for good, their rows gone: purged
	// (called once the purge has committed), deleted by an operator or moved to the dead-letter
	// table. A claim that begins afterwards cannot return them, so the strategy may forget them.
	Finished(ids []int64)
	// FailedClaimEndsEpoch reports whether a failed Claim may have claimed rows that only a new
	// epoch can claim again.
	FailedClaimEndsEpoch() bool
}

// MarkClaim is the original goharvest's strategy, mark and purge: a claim sets leader_id on the
// rows it returns to the epoch's leader ID (DatabaseBinding.Mark), skipping the rows already
// marked with it, and Release clears it again (Reset). A new epoch's leader ID takes over every
// row an earlier epoch marked, so a mark whose reply was lost ends the epoch.
func MarkClaim(store driver.Store, leaderID uuid.UUID) Claimer {
	return markClaim{store: store, leaderID: leaderID}
}

type markClaim struct {
	store    driver.Store
	leaderID uuid.UUID
}

func (m markClaim) Claim(ctx context.Context, limit int, heldKeys []string) ([]driver.MarkedRecord, error) {
	return m.store.MarkExcept(ctx, m.leaderID, limit, heldKeys)
}

func (m markClaim) Release(ctx context.Context, ids []int64) error {
	_, err := m.store.Reset(ctx, m.leaderID, ids)
	return err
}

func (markClaim) FailedClaimEndsEpoch() bool { return true }

// Finished needs nothing: a purged row is gone, and no mark can return it.
func (markClaim) Finished([]int64) {}
