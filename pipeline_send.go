package goharvest

import (
	"errors"
	"time"
)

// sendWorker owns the keys that hash to it: it keeps their records in order, and lets each key
// have one run (see pipeline) with Kafka at a time. Its goroutine (run) owns every field below
// but p, and the flights of its keys (see flight).
type sendWorker struct {
	p      *pipeline
	in     chan *flight        // marked records, from the marker (the only send that waits for room)
	box    *mailbox[workerMsg] // news of its keys' records, from the other stages
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
	w.box.post(m)
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

// keyQueue is one key's records, marked and not yet finished, in the order to publish them.
type keyQueue struct {
	flights []*flight
	out     int // how many at the front are with Kafka: a run in transaction gen
	gen     uint64
	held    *flight // the record that holds back the key, if any (held.go)
}

// holds reports whether the queue has the record with this id. Until its purge commits, a
// record can be marked again.
func (q *keyQueue) holds(id int64) bool {
	for _, f := range q.flights {
		if f.rec.ID == id {
			return true
		}
	}
	return false
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
		case <-w.box.ready:
			msgs, _ := w.box.take(0)
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
		w.p.metrics.markedAgain.Inc()
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
		p.metrics.failed.Inc()
		p.log.Error("outbox record cannot be published; holding back its key", "id", f.rec.ID,
			"topic", f.rec.KafkaTopic, "key", f.rec.KafkaKey, "error", f.rec.Err)
		p.emit(RecordFailed{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: f.rec.KafkaKey, Attempts: f.attempts, Err: f.rec.Err})
		w.hold(q, f, f.rec.Err)
		return false
	}
	err := p.produce(f, q)
	var txnErr *TxnError
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
	case errors.Is(err, ErrQueueFull) || errors.Is(err, ErrTopicPending) || txnErr != nil:
		// Not this record's fault: the producer's queue is full, its topic is being looked up, or
		// the transaction is being committed or must be aborted (librdkafka refuses new messages
		// meanwhile, "Erroneous state"). The record is sent again shortly, uncounted and
		// unreported.
		f.attempts--
		f.held = true
		p.log.Debug("producer cannot take a record now; retrying", "id", f.rec.ID, "error", err)
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
func (p *pipeline) produce(f *flight, q *keyQueue) error {
	p.txnMu.RLock()
	defer p.txnMu.RUnlock()
	if !p.leading() {
		return errNotNow // the owner is about to end this epoch
	}
	extends := q.out > 0
	if extends {
		if q.gen != p.gen || q.out >= p.limits.MaxKeyRun {
			return errNotNow // the run's transaction has ended, or the run is long enough
		}
		if !p.ledger.reserve() {
			return errNotNow // the note is full
		}
	}
	f.attempts++
	p.startSpan(f)
	p.activity.producing(f)
	err := p.producer.Produce(message(&f.rec.OutboxRecord, p.idHeader, f))
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
	p.txnMx.Unlock()
	if first {
		p.produced.poke()
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
func (p *pipeline) rejected(f *flight, err error) time.Duration {
	p.metrics.failed.Inc()
	if f.span != nil {
		f.span.RecordError(err)
	}
	backoff := min(p.limits.IOErrorBackoff<<min(f.attempts-1, 16), maxRetryBackoff)
	p.log.Warn("outbox record rejected; holding back its key and retrying", "id", f.rec.ID,
		"topic", f.rec.KafkaTopic, "key", f.rec.KafkaKey, "attempt", f.attempts, "retryIn", backoff, "error", err)
	p.emit(RecordFailed{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: f.rec.KafkaKey, Attempts: f.attempts, Err: err})
	return backoff
}
