package epoch

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/goharvest/goharvest/internal/seam"
)

// ReadClaim is the strategy that writes nothing to a row but its purge: the epoch reads its
// next rows and keeps in memory which of them it holds (out), so that no later read returns them
// while they are in flight. A new epoch starts with nothing in memory and reads from the head of
// the outbox, as a new mark would take over every row.
//
// Two reads serve it:
//   - From the head: the oldest rows not in out, whatever their ids. This is what finds a row
//     whose transaction took a lower id and committed after higher ids were read, however late it
//     commits, and a row released or skipped while its key was held. It walks the head of the
//     table, past the rows in flight and the dead rows of recent purges.
//   - Forward: the rows above the highest id read so far (cursor), which walks no row twice and
//     none of the dead ones. While a backlog drains (the last read was full) the epoch reads
//     forward, and from the head once every headReadInterval, so that a late commit waits at most
//     that long; once it has caught up, every read is from the head.
//
// Nothing is remembered of ids that were never seen: a rolled-back transaction's ids, sequence
// gaps and transactions still open cost nothing and stall nothing, and a transaction held open for
// days delays only its own rows, which the first read from the head after its commit returns. The
// memory this strategy keeps is out, which holds the records the epoch has in flight or holds
// back (at most MaxInFlightRecords, and the rows held keys had claimed before they were held),
// and one cursor.
func ReadClaim(reader seam.Reader) Claimer {
	return &readClaim{reader: reader, out: map[int64]struct{}{}, cursor: math.MinInt64, fromHead: true}
}

// headReadInterval bounds how long a row that committed late, with an id below those already
// read, waits while a backlog drains: the forward reads are interrupted by a read from the head at
// least this often.
const headReadInterval = time.Second

type readClaim struct {
	reader seam.Reader

	mu sync.Mutex // guards the fields below: the marker claims, committers and workers finish
	// out holds the ids this epoch has read and that are still in flight or held.
	out map[int64]struct{}
	// cursor is the highest id read; the forward read starts above it.
	cursor int64
	// fromHead makes the next read start at the head: the last read was not full (the epoch has
	// caught up), or rows were released.
	fromHead bool
	headAt   time.Time // when the last read from the head began
}

func (r *readClaim) Claim(ctx context.Context, limit int, heldKeys []string) ([]seam.MarkedRecord, error) {
	r.mu.Lock()
	after, exclude := r.cursor, []int64(nil)
	head := r.fromHead || time.Since(r.headAt) >= headReadInterval
	if head {
		after = math.MinInt64 // ids are the table's to choose; BIGSERIAL's start at 1
		exclude = make([]int64, 0, len(r.out))
		for id := range r.out {
			exclude = append(exclude, id)
		}
		r.headAt = time.Now()
	}
	r.mu.Unlock()

	records, err := r.reader.Read(ctx, after, math.MaxInt64, limit, heldKeys, exclude)
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range records {
		r.out[rec.ID] = struct{}{}
		r.cursor = max(r.cursor, rec.ID)
	}
	r.fromHead = len(records) < limit
	return records, nil
}

// Release forgets the rows, so that the next read, from the head, returns them again.
func (r *readClaim) Release(_ context.Context, ids []int64) error {
	r.forget(ids)
	r.mu.Lock()
	r.fromHead = true
	r.mu.Unlock()
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
