package epoch

import (
	"context"
	"sync"

	"github.com/goharvest/goharvest/driver"
)

// ReadClaim is the strategy that writes nothing to a row but its purge: the epoch reads its
// next rows and keeps in memory which of them it holds (out), so that no later read returns them
// while they are in flight. A new epoch starts with nothing in memory, as a new mark would take
// over every row.
//
// Every read starts at the head of the outbox and returns the oldest rows that are not in out and
// whose key is not held, in id order: the rows a mark would take, found without writing. That is
// what keeps each key's order. A row whose transaction took a lower id and committed after higher
// ids were read, however late, is among the oldest rows at the next read, and so is returned
// before any record its writer wrote after that commit; so is a row that was released, or that
// was left unread while its key was held. A read that went on from the highest id read so far
// would skip all of them and could publish a key's next record first; an earlier version did,
// and its tests (TestLateCommitThenNextRecordKeepOrderWhileDraining among them) show how.
//
// Nothing is remembered of ids that were never seen: a rolled-back transaction's ids, sequence
// gaps and transactions still open cost nothing and stall nothing, and a transaction held open for
// days delays only its own rows, which the first read after its commit returns. The memory this
// strategy keeps is out: the records the epoch has in flight or holds back, at most
// MaxInFlightRecords and the rows held keys had claimed before they were held.
func ReadClaim(reader driver.Reader) Claimer {
	return &readClaim{reader: reader, out: map[int64]struct{}{}}
}

type readClaim struct {
	reader driver.Reader

	mu sync.Mutex // guards out: the marker claims, committers and workers finish
	// out holds the ids this epoch has read and that are still in flight or held.
	out map[int64]struct{}
}

func (r *readClaim) Claim(ctx context.Context, limit int, heldKeys []string) ([]driver.MarkedRecord, error) {
	r.mu.Lock()
	exclude := make([]int64, 0, len(r.out))
	for id := range r.out {
		exclude = append(exclude, id)
	}
	r.mu.Unlock()

	records, err := r.reader.Read(ctx, limit, heldKeys, exclude)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range records {
		r.out[rec.ID] = struct{}{}
	}
	return records, nil
}

// Release forgets the rows, so that the next read returns them again.
func (r *readClaim) Release(_ context.Context, ids []int64) error {
	r.forget(ids)
	return nil
}

func (r *readClaim) Finished(ids []int64) { r.forget(ids) }

func (r *readClaim) forget(ids []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, id := range ids {
		delete(r.out, id)
	}
}

// FailedClaimEndsEpoch is false: a read that failed changed nothing, and the next one reads the
// same rows.
func (*readClaim) FailedClaimEndsEpoch() bool { return false }
