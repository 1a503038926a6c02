package epoch

import (
	"context"
	"errors"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
)

// commitLoop purges acknowledged records and resets failed ones, in batches: it takes what has
// gathered while the previous statement ran. Only after a purge commits does it release the
// records' keys, so a key's next record is never sent while this one could still be marked
// again. The committers share the outcomes mailbox; each owns the batch it takes.
func (p *Epoch) commitLoop() {
	for {
		batch, ok := p.outcomes.Wait(MaxCommitBatch)
		if !ok {
			return
		}
		var purge, reset []*flight
		for _, o := range batch {
			if o.failed {
				reset = append(reset, o.f)
			} else {
				purge = append(purge, o.f)
			}
		}
		purge = p.purgeChecked(purge)
		if len(purge) > 0 {
			began := time.Now()
			if p.commit("purge", purge, p.Store.Purge) && p.standbysHold(p.flushCtx, "await standbys after a purge") {
				p.Metrics.PurgeSeconds.Observe(time.Since(began).Seconds())
				p.ledger.forget(purge)
				p.finish(purge)
			}
		}
		if len(reset) > 0 && p.commit("reset", reset, func(ctx context.Context, ids []int64) (int, error) {
			return len(ids), p.Claim.Release(ctx, ids)
		}) {
			p.Metrics.Reset.Add(float64(len(reset)))
		}
	}
}

// commit runs one batched statement, retrying with backoff while the database is unavailable.
// It gives up (returning false) only when the epoch's final flush runs out of time: the rows
// then stay in the outbox and are published again, which duplicates but never reorders.
func (p *Epoch) commit(op string, batch []*flight, exec func(context.Context, []int64) (int, error)) bool {
	ids := make([]int64, len(batch))
	for i, f := range batch {
		ids[i] = f.rec.ID
	}
	ctx := p.flushCtx
	for failed := false; ; failed = true {
		// After a failure the pool may have reached a promoted standby, where these ids can name
		// other rows (standby.go): the records are left to the next epoch.
		if failed && p.serverChanged(ctx) {
			return false
		}
		_, err := exec(driver.WithServer(ctx, p.epochServerOf()), ids)
		if err == nil {
			p.DBTrouble.OK(p.Log)
			return true
		}
		if errors.Is(err, driver.ErrServerChanged) {
			p.requestRemark(op+" on another database server", err)
			return false
		}
		if ctx.Err() != nil {
			carried := 0
			if op == "purge" {
				p.unpurgedMu.Lock()
				for _, f := range batch {
					// A record read afresh after it was held is purged only if its row is unchanged
					// (held.go); by id, the next epoch could delete an operator's correction, so it is
					// left to be marked and published again instead.
					if f.version == "" {
						p.unpurged = append(p.unpurged, f.rec.ID)
						carried++
					}
				}
				p.unpurgedMu.Unlock()
			}
			if carried > 0 {
				p.Log.Warn("gave up on purge at the end of the epoch; the next epoch this harvester leads purges them first",
					"records", carried, "error", err)
			}
			if len(ids) > carried {
				p.Log.Warn("gave up on "+op+" at the end of the epoch; the next epoch marks the records again",
					"records", len(ids)-carried, "error", err)
			}
			return false
		}
		p.DBTrouble.Fail(p.Log, op, err)
		select {
		case <-time.After(p.Limits.IOErrorBackoff):
		case <-ctx.Done():
		}
	}
}

// finish takes purged records off the in-flight budget and hands them back to their workers,
// which release their keys. A worker that has stopped never reads its mailbox; posting to it
// costs nothing.
func (p *Epoch) finish(batch []*flight) {
	// Any mark that returns these rows again began before the records left the budget.
	purgedAt := p.budget.give(batch...)
	ids := make([]int64, len(batch))
	for i, f := range batch {
		f.purgedAt = purgedAt
		f.worker.tell(workerMsg{finished: f})
		ids[i] = f.rec.ID
	}
	p.Claim.Finished(ids)
	p.Metrics.Purged.Add(float64(len(batch)))
	p.Meter.Add(int64(len(batch)))
	if stats, ok := p.Meter.Read(); ok {
		p.Emit(event.MeterRead{Stats: stats})
	}
}
