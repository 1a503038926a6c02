package epoch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/engine/mailbox"
	"github.com/goharvest/goharvest/internal/wakegrid"
)

// txnGather is the least a transaction stays open after the transaction loop finds its first
// record, unless it cannot grow (see activity.stalled): the records a worker produces in one go
// (a marked batch, a run) then share it, even after a quiet spell. It is a one-shot timer per
// transaction, not a poll. It stands in for the millisecond tick the loop used to poll on, which
// committed between 0 and 1 ms after that first record. Measured against that tick (Drain
// benchmarks, three interleaved runs each on a loaded 2-core machine): median records/s
// after/before 1.11 to 2.7, single runs swinging 0.57 to 4.8 with the load; DrainHotKeys with
// maxKeyRun=1, which commits most often, 1.12 to 1.27 in every pair.
const txnGather = time.Millisecond

// lingerFor is the shortest time between the ends of two of an epoch's transactions under load,
// given how many of its harvester's epochs are busy (their latest mark found rows), its own
// included: txnLinger for each, up to maxLingerEpochs. A commit costs the relay about the same
// whatever it carries (the coordinator's round trip, the purge, the partitions added to the
// transaction), and each epoch commits on its own; spaced so, a harvester draining 8 shards
// commits about as often as one draining 1, while a busy shard beside idle ones commits as often
// as a lone one. Measured (DrainShards, one process, 8 shards against 1, 2-core machine): with 10
// ms for each epoch a transaction carried 255 records against one shard's 800, and the relay
// spent 25 to 32% more CPU per record; spaced by busy epochs, 560 to 650 records per purge
// against 520 to 660, and 3% more over six runs (make bench BENCH='Drain$|DrainShards' on a 2-core
// VM). Counting the transactions open at the moment instead came to 2 or 3 of the 8 busy epochs, since an epoch's transaction
// stays empty from its commit until the purges free its keys' next records. What it costs: under
// a backlog of many keys a key's next record waits up to the linger for its commit (see
// MaxKeyRun); a transaction that cannot grow still commits at once (when the marked records' keys
// all wait for it, say, or the harvester keeps up with its writers).
func lingerFor(busy int32) time.Duration {
	return txnLinger * time.Duration(min(max(busy, 1), maxLingerEpochs))
}

// activity is what the transaction loop needs to know of the other stages: whether anything can
// still add records to the current transaction, so that it commits at once when nothing can
// rather than wait out txnLinger; whether records are plentiful (loaded), which decides between
// that and the commit cadence; and whether the producer has reported on every message, which
// an abort and the end of the epoch wait for. Every field is guarded by mu; the stages tell it
// what they do, and it pokes wake when the transaction may have stalled or the load begins.
type activity struct {
	mu         sync.Mutex
	unreported int           // messages produced and not yet reported on
	settled    chan struct{} // closed while unreported is 0
	backlog    int           // marked records and news posted to workers and not yet handled
	marker     markerWait    // what the marker waits for, if anything
	// plentiful says that the marker's latest claim filled the room it asked for: the outbox had
	// at least as many rows ready, a backlog.
	plentiful bool
	wake      mailbox.Wake // tells the transaction loop to look at stalled and loaded again
}

// markerWait is what the marker waits for, if anything.
type markerWait int

const (
	markerBusy markerWait = iota // claiming, or handing records to the workers
	markerRows                   // rows to be written: the outbox had no more ready
	markerRoom                   // room in the pipeline: the in-flight budget is taken
)

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// stalled reports whether the current transaction cannot grow until something commits: every
// message sent has been reported, the marker waits for room or for rows, and the workers have
// nothing new to send (a key with records waiting has a run out).
func (a *activity) stalled() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stalledLocked()
}

func (a *activity) stalledLocked() bool {
	return a.marker != markerBusy && a.unreported <= 0 && a.backlog == 0
}

// loaded reports whether records are plentiful: the marker's latest claim filled its room, or the
// marker waits for room. Then the transaction loop commits as it did before the commit cadence,
// as soon as the transaction cannot grow, and at least a linger after the previous commit.
func (a *activity) loaded() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.loadedLocked()
}

func (a *activity) loadedLocked() bool { return a.plentiful || a.marker == markerRoom }

// changed pokes the transaction loop if the transaction has stalled (mu held).
func (a *activity) changed() {
	if a.stalledLocked() {
		a.wake.Poke()
	}
}

// markerWaits says what the marker waits for from now on; markerBusy, that it waits no more.
func (a *activity) markerWaits(w markerWait) { a.marking(func() { a.marker = w }) }

// claimed says whether the marker's latest claim filled the room it asked for.
func (a *activity) claimed(full bool) { a.marking(func() { a.plentiful = full }) }

// marking applies news of the marker under mu, then pokes the transaction loop if the
// transaction has stalled or the load has just begun, when a transaction waiting out the commit
// cadence may commit sooner.
func (a *activity) marking(news func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	wasLoaded := a.loadedLocked()
	news()
	if !wasLoaded && a.loadedLocked() {
		a.wake.Poke()
		return
	}
	a.changed()
}

// posted counts work handed to workers that could send records; handled, work they are done with.
func (a *activity) posted(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.backlog += n
}

func (a *activity) handled(n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.backlog -= n
	a.changed()
}

// producing counts f's message, about to be produced, as unreported, and forgets what the
// previous report on it said.
func (a *activity) producing(f *flight) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f.failure = nil
	if a.unreported == 0 {
		a.settled = make(chan struct{})
	}
	a.unreported++
}

// reported records the producer's report on f's message: err, if not nil, fails its transaction.
// With f nil it takes back a message the producer refused to take.
func (a *activity) reported(f *flight, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if f != nil && err != nil {
		f.failure = err
	}
	// settled is made on the way from 0 to 1 and closed on the way back, whatever a producer that
	// reported more than it took did to the count meanwhile.
	if a.unreported--; a.unreported == 0 {
		close(a.settled)
		a.changed()
	}
}

// failure returns what the latest report on f's message said (nil: success, or not reported).
func (a *activity) failure(f *flight) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return f.failure
}

func (a *activity) unreportedCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.unreported
}

// awaitReports waits until every produced message has been reported, or until deadline.
func (a *activity) awaitReports(deadline time.Time) bool {
	a.mu.Lock()
	settled := a.settled
	a.mu.Unlock()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-settled:
		return true
	case <-t.C:
		return a.unreportedCount() <= 0
	}
}

// readDeliveries notes what each delivery report says, for the transaction loop, until the
// producer is closed. Success means little before the transaction commits.
func (p *Epoch) readDeliveries() {
	for d := range p.Producer.Deliveries() {
		f, _ := d.Opaque.(*flight)
		p.activity.reported(f, d.Err)
	}
}

// txnLoop commits the current transaction when it holds records and commitDue says so. It owns
// lastEnd and its timer; ending a transaction happens under txnMu (see endTxn).
func (p *Epoch) txnLoop() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var lastEnd time.Time
	for {
		for p.txnEmpty() {
			select {
			case <-p.ctx.Done():
				return
			case <-p.produced:
			}
		}
		if !p.awaitCommit(timer, lastEnd, time.Now()) {
			return
		}
		p.endTxn(p.flushCtx, true)
		lastEnd = time.Now()
	}
}

// awaitCommit waits until the current transaction, whose first record the loop found at found,
// is due (see commitDue); false if the epoch stops meanwhile. A stop ends the wait at once, and
// Stop then commits the transaction: the cadence never holds up the end of an epoch.
func (p *Epoch) awaitCommit(timer *time.Timer, lastEnd, found time.Time) bool {
	defer timer.Stop()
	for {
		due, now := p.commitDue(lastEnd, found)
		if now {
			return true
		}
		wait := time.Until(due)
		if wait <= 0 {
			return true
		}
		timer.Reset(wait)
		select {
		case <-p.ctx.Done():
			return false
		case <-timer.C:
		case <-p.activity.wake:
		}
	}
}

// commitDue says when the current transaction, whose first record the loop found at found,
// commits: now, or at due unless something changes meanwhile (the activity's wake tells).
//
// Under load (activity.loaded: a backlog, or the in-flight budget taken) it commits as soon as it
// cannot grow (activity.stalled), else once a linger (lingerFor) has passed since the previous
// commit ended and txnGather since its first record was found, as it did before the commit
// cadence: the cadence neither adds a wait nor shortens the linger.
//
// Otherwise the outbox had no more rows ready when the marker last looked, and more may be
// written: the transaction waits for them until the next point of the process's grid of period
// CommitCadence after found (package wakegrid), so that every shard of the process commits at
// once, within CommitCadence of its first record. It commits sooner when a record it carries was
// claimed more than twice the cadence ago: such a record waited for its key's previous run to
// commit (MaxKeyRun) or was sent again, and a hot key then gets a commit per record, as it did
// before the cadence, rather than one per cadence; each record so waits at most about two
// cadences for its commit. A cadence no longer than txnGather is none: the transaction commits
// as soon as it cannot grow, as under load.
func (p *Epoch) commitDue(lastEnd, found time.Time) (due time.Time, now bool) {
	gathered := found.Add(txnGather)
	cadence := p.Limits.CommitCadence
	if cadence <= txnGather || p.activity.loaded() {
		if p.activity.stalled() {
			return time.Time{}, true
		}
		return latest(lastEnd.Add(lingerFor(p.BusyEpochs.Load())), gathered), false
	}
	return latest(p.cadenceDue(found), gathered), false
}

// cadenceDue is the latest the current transaction, found at found, commits: the next point of
// the cadence's grid, or twice the cadence after the claim of the oldest record it carries.
func (p *Epoch) cadenceDue(found time.Time) time.Time {
	cadence := p.Limits.CommitCadence
	p.txnMx.Lock()
	oldest := p.txnOldest
	p.txnMx.Unlock()
	return earliest(wakegrid.Next(found, cadence), oldest.Add(2*cadence))
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (p *Epoch) txnEmpty() bool {
	p.txnMx.Lock()
	defer p.txnMx.Unlock()
	return len(p.txn) == 0
}

// endTxn commits the current transaction, if it holds records, and passes them on to be purged;
// when the commit fails it aborts and sorts the records out (see the pipeline's comment). With
// next, it then begins the next transaction. It runs under txnMu, so no record is produced
// meanwhile; what it passes on goes through mailboxes, which never block, so it cannot wait on a
// worker or a committer that waits for txnMu.
func (p *Epoch) endTxn(ctx context.Context, next bool) {
	p.txnMu.Lock()
	defer p.txnMu.Unlock()
	p.txnMx.Lock()
	batch := p.txn
	p.txn, p.txnOldest = nil, time.Time{}
	p.txnMx.Unlock()
	gen := p.gen
	p.gen++
	if len(batch) == 0 {
		return
	}
	extra := runsButLast(batch)
	began := time.Now()
	err := p.fatal
	if err == nil {
		err = p.commitTxn(ctx, batch, extra)
		p.Metrics.CommitSeconds.Observe(time.Since(began).Seconds())
	}
	p.Log.Debug("transaction ended", "records", len(batch), "noted", len(extra), "took", time.Since(began), "error", err)
	outcomes := make([]outcome, 0, len(batch))
	if err == nil {
		p.txnFailures = 0
		for _, f := range extra {
			f.noted = true
		}
		p.ledger.add(extra)
		p.Metrics.Published.Add(float64(len(batch)))
		for _, f := range batch {
			p.endSpan(f, nil)
			outcomes = append(outcomes, outcome{f: f})
		}
		p.outcomes.Post(outcomes...)
		if next {
			p.beginTxn()
		}
		return
	}
	p.ledger.unreserve(len(extra))

	if err != p.fatal {
		p.Metrics.Errors.WithLabelValues(ErrorKindKafka).Inc()
	}
	var txnErr *driver.TxnError
	fatal := errors.As(err, &txnErr) && txnErr.Fatal
	if !fatal {
		if abortErr := p.abortTxn(ctx); abortErr != nil {
			// The producer cannot go on (or the epoch's final flush ran out of time while a commit
			// was still under way); a new epoch brings a new producer, whose InitTransactions
			// settles this transaction either way.
			fatal, err = true, fmt.Errorf("abort transaction: %w", abortErr)
		}
	}
	if fatal {
		p.fatal = err
	}
	// The abort has the producer report on every message of the transaction.
	p.activity.awaitReports(p.until(p.Limits.MaxPollInterval))
	if refused := (*driver.RejectedError)(nil); !errors.As(err, &refused) {
		// A record that was refused fails its transaction, but says nothing of the producer: it is
		// held (held.go), and only its key waits. Other failures, repeated, end the epoch.
		p.txnFailures++
	}
	if fatal || p.txnFailures >= maxTxnFailures || p.ctx.Err() != nil {
		// The epoch ends: the records are reset, and the next epoch marks them again.
		for _, f := range batch {
			var rejected *driver.RejectedError
			if failure := p.activity.failure(f); errors.As(failure, &rejected) {
				p.rejected(f, failure)
			}
			p.endSpan(f, err)
			outcomes = append(outcomes, outcome{f: f, failed: true})
		}
		p.outcomes.Post(outcomes...)
		if p.ctx.Err() == nil {
			p.requestRemark("transaction failed", err)
		}
	} else {
		p.returnRuns(gen, batch)
	}
	if next && !fatal {
		p.beginTxn()
	}
}

// runsButLast returns the records of batch that a later record of the same key follows: what
// the transaction's note must list.
func runsButLast(batch []*flight) []*flight {
	last := make(map[string]int, len(batch))
	for i, f := range batch {
		last[f.rec.KafkaKey] = i
	}
	var extra []*flight
	for i, f := range batch {
		if last[f.rec.KafkaKey] != i {
			extra = append(extra, f)
		}
	}
	return extra
}

// returnRuns sends the runs of aborted transaction gen back to their workers, to be sent again
// from their first records; the records Kafka refused wait out a backoff first.
func (p *Epoch) returnRuns(gen uint64, batch []*flight) {
	runs := map[string]*abortedRun{}
	var firsts []*flight // each run's first record, whose worker owns the key
	for _, f := range batch {
		r := runs[f.rec.KafkaKey]
		if r == nil {
			r = &abortedRun{key: f.rec.KafkaKey, gen: gen}
			runs[r.key] = r
			firsts = append(firsts, f)
		}
		var rejected *driver.RejectedError
		if failure := p.activity.failure(f); errors.As(failure, &rejected) {
			r.hold = append(r.hold, heldRecord{f: f, backoff: p.rejected(f, failure)})
		}
	}
	for _, f := range firsts {
		f.worker.tell(workerMsg{aborted: runs[f.rec.KafkaKey]})
	}
}

// commitTxn writes the transaction's note, if it carries runs, and commits it. A transaction in
// which a message has already failed cannot commit, and librdkafka sends nothing more of it, so
// committing would only wait for the rest to time out: that is reported at once instead.
//
// A commit that times out is still under way inside librdkafka, which then refuses an abort
// ("commit_transaction API call is already in progress"); its documented remedy is to call
// CommitTransaction again until it resolves. So a slow commit is waited out, one bounded call at
// a time, for as long as the epoch lasts; only the epoch's final flush running out of time gives
// up on it.
func (p *Epoch) commitTxn(ctx context.Context, batch, extra []*flight) error {
	for _, f := range batch {
		if failure := p.activity.failure(f); failure != nil {
			return fmt.Errorf("record %d: %w", f.rec.ID, failure)
		}
	}
	checkCtx, cancel := p.attempt(ctx)
	err := p.checkReread(checkCtx, batch)
	cancel()
	if err != nil {
		return err
	}
	if len(extra) > 0 {
		noteCtx, cancel := p.attempt(ctx)
		err := p.Producer.WriteNote(noteCtx, p.Notes, p.ledger.note(extra))
		cancel()
		if err != nil {
			return fmt.Errorf("write note: %w", err)
		}
	}
	return p.retry(ctx, p.Producer.CommitTransaction)
}

// abortTxn aborts the current transaction, calling again while librdkafka says to.
func (p *Epoch) abortTxn(ctx context.Context) error {
	return p.retry(ctx, p.Producer.AbortTransaction)
}

// retry calls a transactional API until it succeeds, fails for good, or ctx ends. Each call gets
// its own deadline (see attempt), so that none outlasts the epoch's final flush; a call that
// fails at once is not repeated at once.
func (p *Epoch) retry(ctx context.Context, call func(context.Context) error) error {
	for {
		callCtx, cancel := p.attempt(ctx)
		err := call(callCtx)
		cancel()
		var txnErr *driver.TxnError
		if !errors.As(err, &txnErr) || !txnErr.Retriable || ctx.Err() != nil {
			return err
		}
		select {
		case <-time.After(busyBackoff):
		case <-ctx.Done():
		}
	}
}

// attempt returns the context for one call to the producer's transactional API. librdkafka takes
// only a context's deadline, as the call's timeout, and cannot be interrupted, so each call gets
// MaxPollInterval, and no more than the epoch's final flush has left.
func (p *Epoch) attempt(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithDeadline(ctx, p.until(p.Limits.MaxPollInterval))
}

// until returns the time d from now, or the end of the epoch's final flush if that comes first.
func (p *Epoch) until(d time.Duration) time.Time {
	t := time.Now().Add(d)
	if end := p.flushDeadline.Load(); end != nil && end.Before(t) {
		return *end
	}
	return t
}

func (p *Epoch) beginTxn() {
	if err := p.Producer.BeginTransaction(); err != nil {
		p.requestRemark("begin transaction", err)
	}
}
