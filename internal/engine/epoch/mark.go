package epoch

import (
	"context"
	"errors"
	"hash/fnv"
	"sync"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/engine/mailbox"
	"github.com/goharvest/goharvest/internal/wakegrid"
)

// budget is the pipeline's one count of records in flight: records this epoch has marked and not
// yet purged (or dropped, or found to be marked twice), except a held key's records from the held
// one on (held.go: so that a key that cannot be published cannot take the budget from the others),
// but for the held record itself while it is sent again (a record counts from its mark until its
// worker, which knows its key is held, takes it). MaxInFlightRecords bounds it: the marker
// marks only into the room left. Held keys can take it past the limit, by one for each held
// record being sent again, and, for a moment, when a key is released: its records marked before
// the hold, in memory already, count again at once. The marker then marks nothing until purges
// bring the count back under the limit. Harvest.InFlightRecords, InFlightRecordKeys and the
// goharvest_in_flight_records and goharvest_in_flight_keys gauges report it.
type budget struct {
	mu    sync.Mutex
	count int            // records in flight (guarded by mu)
	keys  map[string]int // their keys, with how many records each (guarded by mu)
	// marks numbers the mark queries (guarded by mu): the marker adds one before each (see
	// sendWorker.purged).
	marks uint64
	room  mailbox.Wake // wakes the marker when records leave the budget
}

// reserve returns how many records the marker may mark now, at most limit, and when that is
// more than none, the number of the mark it is about to begin.
func (b *budget) reserve(max, limit int) (room int, mark uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	room = min(max-b.count, limit)
	if room <= 0 {
		return 0, 0
	}
	b.marks++
	return room, b.marks
}

// marked counts records just marked.
func (b *budget) marked(records []driver.MarkedRecord) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, r := range records {
		b.keys[r.KafkaKey]++
	}
	b.count += len(records)
}

// take counts records again that had left the budget (a held key's, once released or sent).
func (b *budget) take(fs ...*flight) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, f := range fs {
		b.keys[f.rec.KafkaKey]++
	}
	b.count += len(fs)
}

// give takes records off the count and wakes the marker if it waits for room. It returns the
// number of the latest mark begun, which therefore began before the records left.
func (b *budget) give(fs ...*flight) (lastMark uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, f := range fs {
		if b.keys[f.rec.KafkaKey]--; b.keys[f.rec.KafkaKey] <= 0 {
			delete(b.keys, f.rec.KafkaKey)
		}
	}
	b.count -= len(fs)
	b.room.Poke()
	return b.marks
}

// records returns the count of records in flight.
func (b *budget) records() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.count
}

// snapshot returns the keys in flight, each once, and the count.
func (b *budget) snapshot() (keys []string, records int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for k := range b.keys {
		keys = append(keys, k)
	}
	return keys, b.count
}

// markLoop marks batches while the pipeline has room, backing off while the outbox is empty. It
// owns idle, its backoff, and busy, whether it counts its epoch in busyEpochs.
func (p *Epoch) markLoop() {
	idle := p.Limits.MarkBackoff
	busy := false // counted in busyEpochs
	setBusy := func(b bool) {
		switch {
		case b && !busy:
			p.BusyEpochs.Add(1)
		case !b && busy:
			p.BusyEpochs.Add(-1)
		}
		busy = b
	}
	defer setBusy(false)
	p.noteServer(p.ctx)
	// What earlier epochs purged must be on the standbys before this one publishes those keys.
	if !p.standbysHold(p.ctx, "await standbys at the epoch's start") {
		return
	}
	for p.ctx.Err() == nil {
		room, seq := p.budget.reserve(p.Limits.MaxInFlightRecords, p.Limits.MarkQueryRecords)
		if room <= 0 {
			p.markerWaits(markerRoom, p.Limits.DrainInterval, p.budget.room)
			continue
		}
		wakes := p.wakes.Load()
		heldKeys := p.held.heldKeys()
		began := time.Now()
		records, err := p.Claim.Claim(p.ctx, room, heldKeys)
		p.Metrics.MarkSeconds.Observe(time.Since(began).Seconds())
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			p.emptyAt.Store(0)
			p.DBTrouble.Fail(p.Log, "mark", err)
			if p.Claim.FailedClaimEndsEpoch() {
				p.requestRemark("mark failed", err)
				return
			}
			p.sleep(p.Limits.IOErrorBackoff, nil)
			// The retry may reach a promoted standby, where ids this epoch purged or holds can
			// name other rows (standby.go): a new epoch starts there instead.
			if p.serverChanged(p.ctx) {
				return
			}
			continue
		}
		p.DBTrouble.OK(p.Log)
		setBusy(len(records) > 0)
		p.activity.claimed(len(records) >= room)
		if len(records) == 0 {
			// Nothing claimed, nothing in flight, no key held (before the claim, which then left
			// out no key's rows, and after it): the outbox had no rows for this epoch.
			empty := len(heldKeys) == 0 && p.budget.records() == 0 && len(p.held.heldKeys()) == 0
			if !empty {
				p.emptyAt.Store(0)
			} else if p.emptyAt.Store(wakes + 1); p.covered.Load() {
				// Every write wakes the marker, and so does the end of that (listenLoop); until
				// then the outbox holds nothing to claim, and nothing in flight or held can make a
				// row claimable again, so there is nothing to poll for.
				p.markerWaits(markerRows, 0, p.written)
				// A notification does not say whose rows were written: with shards, most are
				// other shards'. Claimed at once, each would cost a claim that finds nothing, one
				// per writer's commit. So the marker claims no more often than once a cadence
				// window, as after a partial claim; a lone record, after a quiet spell, is claimed
				// at once, its window being past.
				p.awaitClaimWindow(began)
				continue
			}
			p.markerWaits(markerRows, idle, p.written)
			idle = min(2*idle, p.Limits.MaxMarkBackoff)
			continue
		}
		p.emptyAt.Store(0)
		idle = p.Limits.MarkBackoff
		if !p.standbysHold(p.ctx, "await standbys after a mark") {
			return
		}
		p.Metrics.Marked.Add(float64(len(records)))
		p.budget.marked(records)
		p.activity.posted(len(records))
		claimed := time.Now()
		for _, rec := range records {
			w := p.workers[shardOf(rec.KafkaKey, len(p.workers))]
			select {
			case w.in <- &flight{rec: rec, worker: w, markSeq: seq, claimed: claimed}:
			case <-p.ctx.Done():
				return
			}
		}
		if len(records) < room {
			p.awaitNextClaim(began, idle)
		}
	}
}

// awaitNextClaim waits, after a claim that began at began and returned every row it could (the
// outbox had no more ready), until the marker claims again.
//
// A claim now would find only rows committed since. With a commit cadence, what a claim finds
// waits for the next point of the cadence's grid anyway (txn.go, commitDue), so claiming on every
// writer's commit, as the marker once did, cost Postgres a read per notification for nothing: at
// 2,000 records/s from 200 commits a second it read 180 times a second, a transaction's records
// in nine reads. So at light load the marker claims once a cadence, in the cadence's last
// quarter (nextClaimWindow), soon enough for what it finds to join the commit at the point. A row
// written after that claim waits for the next one, so a record is committed within a cadence and
// a quarter of its write; a lone record, written after a quiet spell, is claimed on its
// notification and committed within a cadence (after a claim that found nothing, the marker
// waits for a notification and then for this same window: see markLoop). Notifications that
// arrive meanwhile are kept for the wait that follows, which ends at once on one; without them (a
// store that cannot notify), the marker claims again once MarkBackoff has passed since this claim
// began, as it did before. Without a cadence (CommitCadence no longer than txnGather) there is no
// window to wait for.
func (p *Epoch) awaitNextClaim(began time.Time, idle time.Duration) {
	p.awaitClaimWindow(began)
	if wait := idle - time.Since(began); wait > 0 {
		p.markerWaits(markerRows, wait, p.written)
		return
	}
	// The claim about to begin finds whatever a pending notification announced.
	select {
	case <-p.written:
	default:
	}
}

// awaitClaimWindow waits until nextClaimWindow(began).
func (p *Epoch) awaitClaimWindow(began time.Time) {
	if wait := time.Until(p.nextClaimWindow(began)); wait > 0 {
		p.markerWaits(markerRows, wait, nil)
	}
}

// nextClaimWindow returns when the marker may claim next, at light load, after a claim that
// began at began: the start of the last quarter of the next cadence whose last quarter began
// after began (began itself without a cadence).
func (p *Epoch) nextClaimWindow(began time.Time) time.Time {
	cadence := p.Limits.CommitCadence
	if cadence <= txnGather {
		return began
	}
	lead := cadence / 4
	return wakegrid.Next(began.Add(lead), cadence).Add(-lead)
}

// markerWaits sleeps like sleep, with the transaction loop told meanwhile that the marker adds
// nothing, and why: it waits for rows (the outbox empty) or for room (the pipeline full).
func (p *Epoch) markerWaits(w markerWait, d time.Duration, ch <-chan struct{}) {
	p.activity.markerWaits(w)
	p.sleep(d, ch)
	p.activity.markerWaits(markerBusy)
}

// listenLoop has the binding wake the marker when records are written, and keeps it listening
// through database outages. While it cannot listen, the marker's polling carries on alone; while
// a CoveringListener says its wake-ups cover every write, the marker does not poll at all.
// Notifications that cannot arrive at all (ErrNotificationsLost) are not retried this epoch.
func (p *Epoch) listenLoop() {
	l, trouble := p.Features.Listen, p.Notify
	wake := func() {
		trouble.OK(p.Log)
		p.wakes.Add(1)
		p.written.Poke()
	}
	covered := func(c bool) {
		if !p.covered.Swap(c) || c {
			return
		}
		// No longer covered: the marker, which may be waiting for a wake-up alone, polls again.
		p.written.Poke()
	}
	listen := l.Listen
	if c := p.Features.Covering; c != nil {
		listen = func(ctx context.Context, wake func()) error { return c.ListenCovering(ctx, wake, covered) }
	}
	for {
		err := listen(p.ctx, wake)
		covered(false)
		if p.ctx.Err() != nil {
			return
		}
		trouble.Fail(p.Log, "listen", err, "pollInterval", p.Limits.MaxMarkBackoff)
		if errors.Is(err, driver.ErrNotificationsLost) {
			return
		}
		p.sleep(p.Limits.IOErrorBackoff, nil)
	}
}

// sleep waits for d (0: for ever), for a wake-up on ch (if not nil), or for the pipeline to
// stop.
func (p *Epoch) sleep(d time.Duration, ch <-chan struct{}) {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-timeout:
	case <-ch:
	case <-p.ctx.Done():
	}
}

func shardOf(key string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}
