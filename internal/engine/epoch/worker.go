package epoch

import (
	"errors"
	"slices"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/mailbox"
)

// sendWorker owns the keys that hash to it: it keeps their records in order, and lets each key
// have one run (see pipeline) with Kafka at a time. Its goroutine (run) owns every field below
// but p, and the flights of its keys (see flight).
type sendWorker struct {
	p      *Epoch
	in     chan *flight                // marked records, from the marker (the only send that waits for room)
	box    *mailbox.Mailbox[workerMsg] // news of its keys' records, from the other stages
	queues map[string]*keyQueue
	// purged holds the ids of records finished lately, with their purgedAt, to recognise copies
	// marked again (see wasPurged); prunedAt is the mark number it was last pruned at.
	purged   map[int64]uint64
	prunedAt uint64
}

// workerMsg is news for a worker about a record of one of its keys; one field is set.
type workerMsg struct {
	finished *flight     // purged, from the committers
	aborted  *abortedRun // a run of an aborted transaction, to send again, from the transaction loop
	retry    *flight     // a held record whose backoff is over
	verdict  *verdict    // what the held loop found of a held record's row (held.go)
	stale    *flight     // published, its row changed after it was read, from the committers (held.go)
}

// tell posts news to the worker of its record's key. Any news can have the worker send records,
// so the transaction loop counts it (see activity.stalled) until the worker has acted on it.
func (w *sendWorker) tell(m workerMsg) {
	w.p.activity.posted(1)
	w.box.Post(m)
}

// wasPurged reports whether f is a copy of a record this worker has already finished: a mark
// that began before the record's purge committed can return the row again (after a deposed
// leader marked it), and the copy can reach the worker after the purge's news, when the queue no
// longer holds the record. No mark that begins after the purge commits can return the row, so a
// copy is one whose mark number is at most the purge's purgedAt. Marks are numbered in order and
// each worker receives its records in mark order, so once a record of mark m arrives, no entry
// older than m can match again, and those are forgotten.
func (w *sendWorker) wasPurged(f *flight) bool {
	if f.markSeq > w.prunedAt {
		for id, at := range w.purged {
			if at < f.markSeq {
				delete(w.purged, id)
			}
		}
		w.prunedAt = f.markSeq
	}
	at, ok := w.purged[f.rec.ID]
	return ok && f.markSeq <= at
}

// abortedRun says that a key's run in transaction gen was not committed; hold lists the records
// of it that Kafka refused, each to wait out its backoff before it is sent again.
type abortedRun struct {
	key  string
	gen  uint64
	hold []heldRecord
}

type heldRecord struct {
	f       *flight
	backoff time.Duration
}

func (w *sendWorker) run() {
	for {
		select {
		case <-w.p.ctx.Done():
			return
		case f := <-w.in:
			w.arrive(f)
			w.p.activity.handled(1)
		case <-w.box.Ready:
			msgs, _ := w.box.Take(0)
			for _, m := range msgs {
				w.handle(m)
			}
			w.p.activity.handled(len(msgs))
		}
	}
}

// arrive queues a record from the marker and sends what its key may. Records arrive in the order
// they were marked, which is the order to publish them in: a record committed late, with a lower
// id than one already sent, simply goes next.
func (w *sendWorker) arrive(f *flight) {
	q := w.queues[f.rec.KafkaKey]
	if (q != nil && q.holds(f.rec.ID)) || w.wasPurged(f) {
		// Marked again: a deposed leader that has not yet noticed marked the row, and so this
		// epoch's marker took it back. Queued twice, it would follow the key's later records.
		w.p.Metrics.MarkedAgain.Inc()
		w.p.budget.give(f)
		return
	}
	if q == nil {
		q = &keyQueue{}
		w.queues[f.rec.KafkaKey] = q
	}
	q.flights = append(q.flights, f)
	w.arrived(q, f)
	w.pump(q)
}

// handle acts on news of one of the worker's records.
func (w *sendWorker) handle(m workerMsg) {
	switch {
	case m.finished != nil:
		// The purges of one run may commit in any order; the queue drops its front once done.
		f := m.finished
		f.done = true
		w.purged[f.rec.ID] = f.purgedAt
		q := w.queues[f.rec.KafkaKey]
		for len(q.flights) > 0 && q.flights[0].done {
			q.flights = q.flights[1:]
			q.out--
		}
		w.releaseIfDone(q)
		if len(q.flights) == 0 {
			delete(w.queues, f.rec.KafkaKey)
		} else {
			w.pump(q)
		}
	case m.aborted != nil:
		r := m.aborted
		q := w.queues[r.key]
		for _, h := range r.hold {
			h.f.held = true
			w.retryAfter(h.f, h.backoff)
			w.hold(q, h.f, w.p.activity.failure(h.f))
		}
		if q != nil && q.gen == r.gen && q.out > 0 {
			q.out = 0
			w.pump(q)
		}
	case m.retry != nil:
		w.retryDue(m.retry)
	case m.verdict != nil:
		w.judge(*m.verdict)
	case m.stale != nil:
		w.unpurged(m.stale)
	}
}

// pump sends the key's next records while it may: a new run when none is out, or more of the
// current run while its transaction is open.
func (w *sendWorker) pump(q *keyQueue) {
	for q.out < len(q.flights) {
		f := q.flights[q.out]
		if f.held || !w.maySend(q, f) || !w.send(f, q) {
			return
		}
		f.fresh = false
		q.out++
	}
}

// send publishes f, the next record of q, and reports whether it joined the current
// transaction.
func (w *sendWorker) send(f *flight, q *keyQueue) bool {
	p := w.p
	if f.rec.Err != nil {
		// A malformed row cannot be published; it holds back its key until the held loop reads it
		// afresh and finds it fixed or deleted (held.go).
		f.attempts++
		f.held = true
		p.Metrics.Failed.Inc()
		p.Log.Error("outbox record cannot be published; holding back its key", "id", f.rec.ID,
			"topic", f.rec.KafkaTopic, "key", f.rec.KafkaKey, "error", f.rec.Err)
		p.Emit(event.RecordFailed{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: f.rec.KafkaKey, Attempts: f.attempts, Err: f.rec.Err})
		w.hold(q, f, f.rec.Err)
		return false
	}
	err := p.produce(f, q)
	var txnErr *driver.TxnError
	switch {
	case err == nil:
		return true
	case err == errNotNow:
		return false
	case errors.As(err, &txnErr) && txnErr.Fatal:
		// The producer cannot go on (fenced by a newer epoch, say): nothing this epoch sends can
		// commit, so a new epoch takes over.
		f.attempts--
		p.requestRemark("producer failed", err)
	case errors.Is(err, driver.ErrQueueFull) || errors.Is(err, driver.ErrTopicPending) || txnErr != nil:
		// Not this record's fault: the producer's queue is full, its topic is being looked up, or
		// the transaction is being committed or must be aborted (librdkafka refuses new messages
		// meanwhile, "Erroneous state"). The record is sent again shortly, uncounted and
		// unreported.
		f.attempts--
		f.held = true
		p.Log.Debug("producer cannot take a record now; retrying", "id", f.rec.ID, "error", err)
		w.retryAfter(f, busyBackoff)
	default:
		// Refused as it stands, by Kafka or by our own checks: reported, and retried with backoff
		// while only its key waits.
		f.held = true
		w.retryAfter(f, p.rejected(f, err))
		w.hold(q, f, err)
	}
	return false
}

// errNotNow says that a record may not join the current transaction; it waits for its key's
// run to finish, or for the epoch to end.
var errNotNow = errors.New("not now")

// produce hands f to the producer in the current transaction, as the start of a run or as more
// of q's run if that is still open.
func (p *Epoch) produce(f *flight, q *keyQueue) error {
	p.txnMu.RLock()
	defer p.txnMu.RUnlock()
	if !p.Leading() {
		return errNotNow // the owner is about to end this epoch
	}
	extends := q.out > 0
	if extends {
		if q.gen != p.gen || q.out >= p.Limits.MaxKeyRun {
			return errNotNow // the run's transaction has ended, or the run is long enough
		}
		if !p.ledger.reserve() {
			return errNotNow // the note is full
		}
	}
	f.attempts++
	p.startSpan(f)
	p.activity.producing(f)
	err := p.Producer.Produce(message(&f.rec.OutboxRecord, p.IDHeader, f))
	if err != nil {
		p.activity.reported(nil, nil)
		if extends {
			p.ledger.unreserve(1)
		}
		return err
	}
	q.gen = p.gen
	p.txnMx.Lock()
	p.txn = append(p.txn, f)
	first := len(p.txn) == 1
	if first || f.claimed.Before(p.txnOldest) {
		p.txnOldest = f.claimed
	}
	p.txnMx.Unlock()
	if first {
		p.produced.Poke()
	}
	return nil
}

// retryAfter releases the held record f after d, unless the epoch ends first.
func (w *sendWorker) retryAfter(f *flight, d time.Duration) {
	time.AfterFunc(d, func() {
		if w.p.ctx.Err() == nil {
			w.tell(workerMsg{retry: f})
		}
	})
}

// rejected reports a record that Kafka (or the producer) refused as it stands, and returns how
// long it should wait (holding back its key) before it is sent again. The worker calls it while
// it holds f, the transaction loop while f is out.
func (p *Epoch) rejected(f *flight, err error) time.Duration {
	p.Metrics.Failed.Inc()
	if f.span != nil {
		f.span.RecordError(err)
	}
	backoff := min(p.Limits.IOErrorBackoff<<min(f.attempts-1, 16), maxRetryBackoff)
	p.Log.Warn("outbox record rejected; holding back its key and retrying", "id", f.rec.ID,
		"topic", f.rec.KafkaTopic, "key", f.rec.KafkaKey, "attempt", f.attempts, "retryIn", backoff, "error", err)
	p.Emit(event.RecordFailed{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: f.rec.KafkaKey, Attempts: f.attempts, Err: err})
	return backoff
}

// arrived accounts for f, just queued in q: a held key's later records are free.
func (w *sendWorker) arrived(q *keyQueue, f *flight) {
	if q.held != nil {
		f.free = true
		w.p.budget.give(f)
	}
}

// hold makes f, which has just failed with err, hold back its key (see the top of this file).
// The caller has arranged its retry, if any.
func (w *sendWorker) hold(q *keyQueue, f *flight, err error) {
	if q == nil || q.index(f) < 0 {
		return
	}
	if f.firstFailure.IsZero() {
		f.firstFailure = time.Now()
		if earlier, ok := w.p.Failures.recall(f.rec.ID); ok {
			// Held in an earlier epoch: the dead-letter limits count from its first failure.
			f.firstFailure = earlier.first
			f.attempts += earlier.attempts
		}
	}
	w.p.Failures.note(f.rec.ID, f.firstFailure, f.attempts)
	f.lastErr = err
	f.fresh = false
	if q.held == nil || q.index(f) < q.index(q.held) {
		q.held = f
	}
	var freed []*flight
	for _, g := range q.flights[max(q.index(q.held), 0):] {
		if !g.free {
			g.free = true
			freed = append(freed, g)
		}
	}
	if len(freed) > 0 {
		w.p.budget.give(freed...)
	}
	w.p.held.put(f, q.key(), err, false)
}

// release ends the hold on q's key once its held record is gone: its records count again, up
// to the next record that failed, if any, which holds the key in turn.
func (w *sendWorker) release(q *keyQueue) {
	q.held = nil
	var counted []*flight
	for _, g := range q.flights {
		if q.held == nil && !g.done && !g.firstFailure.IsZero() {
			q.held = g
		}
		if q.held == nil && g.free {
			g.free = false
			counted = append(counted, g)
		}
	}
	if len(counted) > 0 {
		w.p.budget.take(counted...)
	}
}

// releaseIfDone releases q's key if its held record has been purged.
func (w *sendWorker) releaseIfDone(q *keyQueue) {
	if q.held != nil && q.held.done {
		w.p.held.remove(q.held.rec.ID)
		w.p.Failures.forget(q.held.rec.ID)
		w.release(q)
	}
}

// maySend reports whether f, the next record of q, may be sent now.
func (w *sendWorker) maySend(q *keyQueue, f *flight) bool {
	if q.out > 0 && q.flights[q.out-1].version != "" {
		// A run does not grow past a re-read record: should its purge find the row changed, it is
		// sent again, and must not follow a later record of its key.
		return false
	}
	if f.doomed {
		return false
	}
	if q.held != f && f.version == "" {
		return true // a record before the held one (nothing after it gets this far)
	}
	if q.held != f && !f.fresh {
		// A record read afresh once, back from an aborted transaction: its row may have changed
		// since, so it holds its key again until it has been read again.
		w.hold(q, f, errors.New("sent and not committed; reading its row again before sending it again"))
	}
	if !f.fresh {
		f.held, f.due = true, true
		w.p.wakeHeldLoop()
		return false
	}
	if f.free {
		f.free = false
		w.p.budget.take(f)
	}
	return true
}

// retryDue handles a held record whose backoff is over: it is sent once it has been read afresh.
func (w *sendWorker) retryDue(f *flight) {
	q := w.queues[f.rec.KafkaKey]
	if q == nil || q.index(f) < 0 || f.doomed {
		return
	}
	if q.held == f && !f.fresh {
		f.due = true
		w.p.wakeHeldLoop()
		return
	}
	f.held = false
	w.pump(q)
}

// verdict is what the held loop found of a held record's row.
type verdict struct {
	f       *flight
	kind    verdictKind
	rec     driver.MarkedRecord // the row read afresh (verdictRead)
	version string
}

type verdictKind int

const (
	verdictRead         verdictKind = iota // the row as it is now
	verdictDeleted                         // the row is gone
	verdictMoved                           // the row's key changed; it was reset, to be marked under its new key
	verdictDeadLettered                    // the held loop moved the row into the dead-letter table
)

// judge acts on what the held loop found of f's row.
func (w *sendWorker) judge(v verdict) {
	p, f := w.p, v.f
	q := w.queues[f.rec.KafkaKey]
	i := -1
	if q != nil {
		i = q.index(f)
	}
	if i < 0 || i < q.out || f.done {
		return // purged meanwhile, or being sent: its purge checks the row again
	}
	attrs := []any{"id", f.rec.ID, "topic", f.rec.KafkaTopic, "key", f.rec.KafkaKey}
	switch v.kind {
	case verdictDeleted, verdictMoved:
		w.drop(q, f)
		if v.kind == verdictDeleted {
			p.Claim.Finished([]int64{f.rec.ID}) // a moved row was released, to be claimed under its new key
		}
		p.Metrics.HeldDeleted.Inc()
		p.Log.Warn("held outbox record deleted (or given another key) in the outbox; dropped it and released its key", attrs...)
		p.Emit(event.HeldRecordDeleted{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: f.rec.KafkaKey})
	case verdictDeadLettered:
		w.drop(q, f)
		p.Claim.Finished([]int64{f.rec.ID})
		p.Metrics.DeadLettered.Inc()
		p.Log.Error("held outbox record moved to the dead-letter table; its key's later records are published without it",
			append(attrs, "attempts", f.attempts, "error", f.lastErr)...)
		p.Emit(event.RecordDeadLettered{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: f.rec.KafkaKey, Attempts: f.attempts, Err: f.lastErr})
	case verdictRead:
		f.version = v.version
		if !sameContent(f.rec, v.rec) {
			p.Log.Info("held outbox record changed in the outbox; sending its new content", attrs...)
			f.rec, f.fresh, f.held, f.due, f.doomed = v.rec, true, false, false, false
			if f.rec.Err != nil {
				f.fresh, f.held = false, true
				w.hold(q, f, f.rec.Err)
				p.Log.Error("outbox record cannot be published; holding back its key", append(attrs, "error", f.rec.Err)...)
				return
			}
			p.held.put(f, q.key(), f.lastErr, false)
			w.pump(q)
			return
		}
		if w.pastLimits(f) {
			f.doomed, f.held = true, true
			p.held.put(f, q.key(), f.lastErr, true)
			p.wakeHeldLoop()
			return
		}
		if f.due && f.rec.Err == nil {
			f.fresh, f.held, f.due = true, false, false
			w.pump(q)
		}
	}
}

// pastLimits reports whether f has failed for longer or more often than dead letters allow.
func (w *sendWorker) pastLimits(f *flight) bool {
	l := w.p.Limits
	return (l.DeadLetterAttempts > 0 && f.attempts >= l.DeadLetterAttempts) ||
		(l.DeadLetterAfter > 0 && !f.firstFailure.IsZero() && time.Since(f.firstFailure) >= l.DeadLetterAfter)
}

// drop removes f, which is not being sent, from q, and releases its key if it held it.
func (w *sendWorker) drop(q *keyQueue, f *flight) {
	p := w.p
	i := q.index(f)
	q.flights = slices.Delete(q.flights, i, i+1)
	if !f.free {
		p.budget.give(f)
	}
	f.free, f.done = true, true
	p.held.remove(f.rec.ID)
	p.Failures.forget(f.rec.ID)
	if q.held == f {
		w.release(q)
	}
	if len(q.flights) == 0 {
		delete(w.queues, f.rec.KafkaKey)
		return
	}
	w.pump(q)
}

// unpurged takes back f, published and committed, whose row changed or went after it was read:
// it holds its key again, is read afresh, and its new content (if any) is sent.
func (w *sendWorker) unpurged(f *flight) {
	q := w.queues[f.rec.KafkaKey]
	if q == nil {
		return
	}
	i := q.index(f)
	if i < 0 {
		return
	}
	q.out = i // nothing after f was sent (see maySend)
	f.held, f.due = true, true
	w.hold(q, f, errors.New("row changed after it was read; publishing it again"))
	w.p.wakeHeldLoop()
}
