package goharvest

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/goharvest/goharvest/metric"
)

// The pipeline publishes one leader epoch: everything it does carries one leader ID and goes
// through one transactional producer, which is closed before the next epoch starts. The
// producer's InitTransactions fenced every earlier epoch's producer, so nothing from an old
// epoch, in this process or another, can land after this one has begun.
//
//	marker ──> send workers (sharded by key) ──> producer (current transaction)
//	              ^                                   │
//	              │                       transaction loop: note, commit, begin
//	              │                                   │
//	              └──── key finished <── committers (purge) <── committed records
//
// The marker marks batches from the head of the outbox while the pipeline has room
// (MaxInFlightRecords counts every record marked and not yet finished), and hands each record
// to the send worker that owns its key. A worker keeps a queue per key, and a key's records
// with Kafka all belong to one transaction: its first record starts a run in the current
// transaction, and more join the run while that transaction stays open (up to MaxKeyRun, and
// while the note has room; see note.go). The key's next run starts only once this run has been
// committed and purged. The transaction loop commits whatever has been produced, continuously,
// and passes the committed records to the committers, which purge them in batches (one DELETE
// for many rows, while the next batch gathers) and then tell the workers.
//
// When a commit fails, the transaction is aborted and its runs go back to their workers, which
// send each again from its first record in the next transaction: nothing of an aborted
// transaction was committed, so the worst a consumer can see is a record repeated. A record
// Kafka refused outright is retried with backoff, holding back only its own key. (The reference
// algorithm resets and remarks on every failed delivery because it cannot tell what else of a
// batch was sent; with transactions that churn buys nothing.) A fatal producer error (fenced by
// a newer epoch, say) resets the records and asks for a remark: the owner ends the epoch and
// starts another under a new leader ID, which marks everything not yet purged again, from the
// head, in order.

const (
	// committers is how many purge statements may run at once; with two, one gathers a batch
	// while the other executes.
	committers = 2
	// maxCommitBatch bounds the ids in one purge or reset statement.
	maxCommitBatch = 5000
	// maxRetryBackoff bounds the wait before retrying a record Kafka refused.
	maxRetryBackoff = time.Minute
	// busyBackoff is the wait before sending again a record the producer could not take (its
	// queue full, a topic being looked up, a transaction ending).
	busyBackoff = 10 * time.Millisecond
	// txnLinger is the shortest time between the ends of two transactions under load: records
	// gather meanwhile, so that each commit (a round trip to the transaction coordinator, and a
	// purge) carries many. A transaction that follows a quiet spell commits at once.
	txnLinger = 10 * time.Millisecond
	// txnPoll is how often the transaction loop looks for a reason to commit while the current
	// transaction holds records; while it is empty, the loop sleeps until a record is produced.
	txnPoll = time.Millisecond
	// maxTxnFailures is how many commits may fail in a row before the epoch ends, and a new
	// producer, under a new leader ID, takes over.
	maxTxnFailures = 3
)

// flight is one record on its way through the pipeline.
type flight struct {
	rec      MarkedRecord
	worker   *sendWorker
	attempts int
	tracked  bool       // counted among the in-flight keys
	span     trace.Span // the publish span, when tracing is on
	// held and done belong to the worker: held stops the key's queue at this record (waiting out
	// a backoff, or malformed); done means purged, to be dropped from the queue.
	held, done bool
	// noted means a committed note lists this record (set before the record reaches the
	// committers).
	noted bool
	// markSeq numbers the mark that returned this record; purgedAt is the number of the latest
	// mark begun when its purge had committed (see sendWorker.purged).
	markSeq, purgedAt uint64
	// failure is what the delivery report said about the latest send (nil: success or not yet
	// reported); the delivery reader writes it while the transaction loop may read it.
	failure atomic.Pointer[error]
	// The worker owns these too; see held.go. free: not counted against MaxInFlightRecords (a
	// held key's record). due: backoff over, to be sent once read afresh. fresh: read afresh since
	// the last attempt. doomed: to be moved to the dead-letter table, never sent. version: the row
	// version read afresh ("" for content from the mark). firstFailure, lastErr: its failures.
	free, due, fresh, doomed bool
	version                  string
	firstFailure             time.Time
	lastErr                  error
}

func (f *flight) deliveryFailure() error {
	if e := f.failure.Load(); e != nil {
		return *e
	}
	return nil
}

// outcome is Kafka's verdict on a flight, for the committers.
type outcome struct {
	f      *flight
	failed bool // reset rather than purge
}

type pipelineDeps struct {
	leaderID  uuid.UUID
	limits    Limits
	db        DatabaseBinding
	producer  KafkaProducer
	log       *slog.Logger
	emit      func(Event)
	meter     *metric.Meter
	dbTrouble *episode
	metrics   *metrics
	// tracer records a span per published record; nil when tracing is off.
	tracer trace.Tracer
	// leading reports whether this harvester may still publish; workers ask before each send.
	leading func() bool
	// notes is where this epoch's transactions write their notes.
	notes NotePlace
	// idHeader names the header that carries each record's id; "" for none (Config.IDHeader).
	idHeader string
	// failures remembers held records' failures across epochs (held.go).
	failures *failureMemo
	// notify reports listening trouble once per outage, across epochs.
	notify *episode
}

type pipeline struct {
	pipelineDeps

	ctx    context.Context // cancelled to stop marking and sending
	cancel context.CancelFunc
	// flushCtx bounds purges, resets and commits: cancelled only when the epoch's final flush runs
	// out of time, which also interrupts a statement stuck on a locked table.
	flushCtx    context.Context
	flushCancel context.CancelFunc
	// flushDeadline is when the final flush gives up, once stop has begun; every call to the
	// producer's transactional API ends by then (see attempt).
	flushDeadline atomic.Pointer[time.Time]

	// unpurged lists records committed to Kafka whose purge was given up when the final flush ran
	// out of time (guarded by unpurgedMu): the next epoch purges them before it marks anything.
	unpurgedMu sync.Mutex
	unpurged   []int64

	// txnMu lets workers produce (read lock) or the transaction loop end a transaction (write
	// lock), never both; txn holds the records produced in the current transaction, and gen
	// numbers it, so that a worker can tell whether a run's transaction is still open.
	txnMu sync.RWMutex
	txnMx sync.Mutex // guards txn while workers append to it under the read lock
	txn   []*flight
	gen   uint64
	// produced wakes the transaction loop when a record joins an empty transaction.
	produced chan struct{}
	// txnFailures counts commits that failed in a row (guarded by txnMu): retrying in place is
	// right for a passing fault, but a producer whose transactions keep failing is replaced.
	txnFailures int
	// fatal is the producer's fatal error, once it has had one (guarded by txnMu): nothing it
	// still holds can commit, so the epoch's last flush does not try.
	fatal error

	workers  []*sendWorker
	outcomes chan outcome // from the transaction loop to the committers

	queued     atomic.Int64  // marked and not finished: bounded by MaxInFlightRecords
	unreported atomic.Int64  // produced, delivery not yet reported
	room       chan struct{} // one slot: wakes the marker when records finish
	starved    atomic.Bool   // the marker is waiting: the pipeline is full, or the outbox empty
	// marks numbers the mark queries: the marker adds one before each (see sendWorker.purged).
	marks   atomic.Uint64
	written chan struct{} // one slot: wakes an idle marker when records are written

	remarkOnce sync.Once
	remarkCh   chan struct{} // closed when the epoch should end with a remark
	remarkErr  atomic.Bool   // the remark was caused by an error: back off before the next epoch

	keysMu sync.Mutex
	keys   map[string]int // keys with a record sent (or held for retry) and not finished

	held        heldSet       // held records and keys (held.go)
	heldWake    chan struct{} // one slot: wakes the held loop
	deadTrouble *episode      // moving rows to the dead-letter table fails

	// ledger holds the records committed notes list and not yet purged; noted counts those and
	// the records the current transaction's note will list, and stays within maxNotedRecords.
	ledger ledger
	noted  atomic.Int64

	sending    sync.WaitGroup // marker and workers
	delivering sync.WaitGroup // delivery reader
	committing sync.WaitGroup // committers
}

func startPipeline(deps pipelineDeps) *pipeline {
	ctx, cancel := context.WithCancel(context.Background())
	flushCtx, flushCancel := context.WithCancel(context.Background())
	max := deps.limits.MaxInFlightRecords
	p := &pipeline{
		pipelineDeps: deps,
		ctx:          ctx,
		cancel:       cancel,
		flushCtx:     flushCtx,
		flushCancel:  flushCancel,
		outcomes:     make(chan outcome, max),
		room:         make(chan struct{}, 1),
		written:      make(chan struct{}, 1),
		produced:     make(chan struct{}, 1),
		remarkCh:     make(chan struct{}),
		keys:         map[string]int{},
		heldWake:     make(chan struct{}, 1),
		deadTrouble:  &episode{what: "dead-letter table (held records stay held)"},
	}
	for range deps.limits.SendConcurrency {
		w := &sendWorker{
			p:        p,
			in:       make(chan *flight, deps.limits.SendBuffer),
			finished: make(chan *flight, max),
			aborted:  make(chan abortedRun, max),
			retry:    make(chan *flight, max),
			verdicts: make(chan verdict, max),
			stale:    make(chan *flight, max),
			queues:   map[string]*keyQueue{},
			purged:   map[int64]uint64{},
		}
		p.workers = append(p.workers, w)
		p.sending.Go(w.run)
	}
	p.sending.Go(p.markLoop)
	if l, ok := deps.db.(Listener); ok {
		p.sending.Go(func() { p.listenLoop(l) })
	}
	p.sending.Go(p.txnLoop)
	if b, ok := deps.db.(HeldRowBinding); ok {
		p.sending.Go(func() { p.heldLoop(b) })
	}
	p.delivering.Go(p.readDeliveries)
	for range committers {
		p.committing.Go(p.commitLoop)
	}
	return p
}

// remark returns a channel that is closed when the epoch should end and a new leader ID begin.
func (p *pipeline) remark() <-chan struct{} { return p.remarkCh }

func (p *pipeline) requestRemark(reason string, err error) {
	if err != nil {
		p.remarkErr.Store(true)
	}
	p.remarkOnce.Do(func() {
		p.log.Info("remark requested", "reason", reason, "error", err, "leaderID", p.leaderID)
		close(p.remarkCh)
	})
}

// markLoop marks batches while the pipeline has room, backing off while the outbox is empty.
func (p *pipeline) markLoop() {
	idle := p.limits.MarkBackoff
	for p.ctx.Err() == nil {
		room := p.limits.MaxInFlightRecords - int(p.queued.Load())
		if room <= 0 {
			p.starved.Store(true)
			p.sleep(p.limits.DrainInterval, p.room)
			p.starved.Store(false)
			continue
		}
		began := time.Now()
		seq := p.marks.Add(1)
		records, err := p.mark(p.ctx, min(room, p.limits.MarkQueryRecords))
		p.metrics.markSeconds.Observe(time.Since(began).Seconds())
		if err != nil {
			if p.ctx.Err() != nil {
				return
			}
			p.dbTrouble.fail(p.log, "mark", err)
			// The update may have committed with its reply lost: those rows would carry this leader
			// ID and never be marked again under it. Only a new leader ID brings them back.
			p.requestRemark("mark failed", err)
			return
		}
		p.dbTrouble.ok(p.log)
		if len(records) == 0 {
			p.starved.Store(true)
			p.sleep(idle, p.written)
			p.starved.Store(false)
			idle = min(2*idle, p.limits.MaxMarkBackoff)
			continue
		}
		idle = p.limits.MarkBackoff
		p.metrics.marked.Add(float64(len(records)))
		p.queued.Add(int64(len(records)))
		for _, rec := range records {
			w := p.workers[shardOf(rec.KafkaKey, len(p.workers))]
			select {
			case w.in <- &flight{rec: rec, worker: w, markSeq: seq}:
			case <-p.ctx.Done():
				return
			}
		}
	}
}

// listenLoop has the binding wake the marker when records are written, and keeps it listening
// through database outages. While it cannot listen, the marker's polling carries on alone.
// Notifications that cannot arrive at all (ErrNotificationsLost) are not retried this epoch.
func (p *pipeline) listenLoop(l Listener) {
	trouble := p.notify
	wake := func() {
		trouble.ok(p.log)
		select {
		case p.written <- struct{}{}:
		default:
		}
	}
	for {
		err := l.Listen(p.ctx, wake)
		if p.ctx.Err() != nil {
			return
		}
		trouble.fail(p.log, "listen", err, "pollInterval", p.limits.MaxMarkBackoff)
		if errors.Is(err, ErrNotificationsLost) {
			return
		}
		p.sleep(p.limits.IOErrorBackoff, nil)
	}
}

// sleep waits for d, for a wake-up on ch (if not nil), or for the pipeline to stop.
func (p *pipeline) sleep(d time.Duration, ch <-chan struct{}) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ch:
	case <-p.ctx.Done():
	}
}

func shardOf(key string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// sendWorker owns the keys that hash to it: it keeps their records in order, and lets each key
// have one run (see pipeline) with Kafka at a time.
type sendWorker struct {
	p        *pipeline
	in       chan *flight    // marked records, from the marker
	finished chan *flight    // purged records, from the committers
	aborted  chan abortedRun // runs of aborted transactions, to send again
	retry    chan *flight    // held records whose backoff is over
	verdicts chan verdict    // what the held loop found of held rows (held.go)
	stale    chan *flight    // published records whose rows changed after they were read (held.go)
	queues   map[string]*keyQueue
	// purged holds the ids of records finished lately, with their purgedAt, to recognise copies
	// marked again (see wasPurged); prunedAt is the mark number it was last pruned at.
	purged   map[int64]uint64
	prunedAt uint64
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
			// Records arrive in the order they were marked, which is the order to publish them in:
			// a record committed late, with a lower id than one already sent, simply goes next.
			q := w.queues[f.rec.KafkaKey]
			if (q != nil && q.holds(f.rec.ID)) || w.wasPurged(f) {
				// Marked again: a deposed leader that has not yet noticed marked the row, and so
				// this epoch's marker took it back. Queued twice, it would follow the key's later
				// records.
				w.p.metrics.markedAgain.Inc()
				w.p.makeRoom(1)
				continue
			}
			if q == nil {
				q = &keyQueue{}
				w.queues[f.rec.KafkaKey] = q
			}
			q.flights = append(q.flights, f)
			w.arrived(q, f)
			w.pump(q)
		case f := <-w.finished:
			// The purges of one run may commit in any order; the queue drops its front once done.
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
		case r := <-w.aborted:
			q := w.queues[r.key]
			for _, h := range r.hold {
				h.f.held = true
				w.retryAfter(h.f, h.backoff)
				w.hold(q, h.f, h.f.deliveryFailure())
			}
			if q != nil && q.gen == r.gen && q.out > 0 {
				q.out = 0
				w.pump(q)
			}
		case f := <-w.retry:
			w.retryDue(f)
		case v := <-w.verdicts:
			w.judge(v)
		case f := <-w.stale:
			w.unpurged(f)
		}
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
		p.track(f)
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
		if p.noted.Add(1) > maxNotedRecords {
			p.noted.Add(-1)
			return errNotNow // the note is full
		}
	}
	f.attempts++
	f.failure.Store(nil)
	p.track(f)
	p.startSpan(f)
	p.unreported.Add(1)
	err := p.producer.Produce(message(&f.rec.OutboxRecord, p.idHeader, f))
	if err != nil {
		p.unreported.Add(-1)
		if extends {
			p.noted.Add(-1)
		}
		return err
	}
	q.gen = p.gen
	p.txnMx.Lock()
	p.txn = append(p.txn, f)
	first := len(p.txn) == 1
	p.txnMx.Unlock()
	if first {
		select {
		case p.produced <- struct{}{}:
		default:
		}
	}
	return nil
}

// retryAfter releases the held record f after d, unless the epoch ends first.
func (w *sendWorker) retryAfter(f *flight, d time.Duration) {
	time.AfterFunc(d, func() {
		select {
		case w.retry <- f:
		case <-w.p.ctx.Done():
		}
	})
}

// rejected reports a record that Kafka (or the producer) refused as it stands, and returns how
// long it should wait (holding back its key) before it is sent again.
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

// readDeliveries notes what each delivery report says, for the transaction loop, until the
// producer is closed. Success means little before the transaction commits.
func (p *pipeline) readDeliveries() {
	for d := range p.producer.Deliveries() {
		if d.Err != nil {
			d.Opaque.(*flight).failure.Store(&d.Err)
		}
		p.unreported.Add(-1)
	}
}

// txnLoop commits the current transaction when it holds records and either a linger has passed
// since the previous commit ended or the transaction cannot grow: every record sent has been
// reported, and no more can be sent until something commits (the marker waits for room or for
// records, the workers have nothing new, and each key with records waiting has one out).
func (p *pipeline) txnLoop() {
	tick := time.NewTicker(txnPoll)
	defer tick.Stop()
	var lastEnd time.Time
	for {
		p.txnMx.Lock()
		waiting := len(p.txn)
		p.txnMx.Unlock()
		wake := tick.C
		if waiting == 0 {
			wake = nil
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.produced:
			continue
		case <-wake:
		}
		if time.Since(lastEnd) >= txnLinger || p.stalled() {
			p.endTxn(p.flushCtx, true)
			lastEnd = time.Now()
		}
	}
}

// stalled reports whether the current transaction cannot grow until something commits.
func (p *pipeline) stalled() bool {
	if !p.starved.Load() || p.unreported.Load() > 0 {
		return false
	}
	for _, w := range p.workers {
		if len(w.in) > 0 || len(w.retry) > 0 || len(w.aborted) > 0 {
			return false
		}
	}
	return true
}

// endTxn commits the current transaction, if it holds records, and passes them on to be purged;
// when the commit fails it aborts and sorts the records out (see the pipeline's comment). With
// next, it then begins the next transaction.
func (p *pipeline) endTxn(ctx context.Context, next bool) {
	p.txnMu.Lock()
	h := p.endTxnLocked(ctx, next)
	p.txnMu.Unlock()
	h.deliver(p)
}

// handoff is what an ended transaction passes on: outcomes for the committers, and aborted runs
// for their workers. It is delivered after txnMu is released, because either side may be full
// and its reader waiting for txnMu (a worker producing, a committer finishing records for such a
// worker): handing it over under the lock could deadlock. Held keys' records do not count
// against MaxInFlightRecords, so no channel capacity can rule that out.
type handoff struct {
	outcomes []outcome
	runs     []abortedRun
	workers  []*sendWorker // the worker of each run
}

func (h *handoff) deliver(p *pipeline) {
	for _, o := range h.outcomes {
		p.outcomes <- o
	}
	for i, r := range h.runs {
		select {
		case h.workers[i].aborted <- r:
		case <-p.ctx.Done(): // the workers are gone; the epoch resets what it holds
		}
	}
}

// endTxnLocked is endTxn's work under txnMu; what it returns goes on once the lock is released.
func (p *pipeline) endTxnLocked(ctx context.Context, next bool) (h handoff) {
	p.txnMx.Lock()
	batch := p.txn
	p.txn = nil
	p.txnMx.Unlock()
	gen := p.gen
	p.gen++
	if len(batch) == 0 {
		return h
	}
	extra := runsButLast(batch)
	began := time.Now()
	err := p.fatal
	if err == nil {
		err = p.commitTxn(ctx, batch, extra)
		p.metrics.commitSeconds.Observe(time.Since(began).Seconds())
	}
	p.log.Debug("transaction ended", "records", len(batch), "noted", len(extra), "took", time.Since(began), "error", err)
	if err == nil {
		p.txnFailures = 0
		for _, f := range extra {
			f.noted = true
		}
		p.ledger.add(extra)
		p.metrics.published.Add(float64(len(batch)))
		for _, f := range batch {
			p.endSpan(f, nil)
			h.outcomes = append(h.outcomes, outcome{f: f})
		}
		if next {
			p.beginTxn()
		}
		return h
	}
	p.noted.Add(-int64(len(extra)))

	if err != p.fatal {
		p.metrics.errors.WithLabelValues(errorKindKafka).Inc()
	}
	var txnErr *TxnError
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
	p.awaitReports(p.until(p.limits.MaxPollInterval))
	if refused := (*RejectedError)(nil); !errors.As(err, &refused) {
		// A record that was refused fails its transaction, but says nothing of the producer: it is
		// held (held.go), and only its key waits. Other failures, repeated, end the epoch.
		p.txnFailures++
	}
	if fatal || p.txnFailures >= maxTxnFailures || p.ctx.Err() != nil {
		// The epoch ends: the records are reset, and the next epoch marks them again.
		for _, f := range batch {
			var rejected *RejectedError
			if failure := f.deliveryFailure(); errors.As(failure, &rejected) {
				p.rejected(f, failure)
			}
			p.endSpan(f, err)
			h.outcomes = append(h.outcomes, outcome{f: f, failed: true})
		}
		if p.ctx.Err() == nil {
			p.requestRemark("transaction failed", err)
		}
	} else {
		p.returnRuns(gen, batch, &h)
	}
	if next && !fatal {
		p.beginTxn()
	}
	return h
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

// returnRuns gathers the runs of aborted transaction gen for their workers (h delivers them), to
// be sent again from their first records; the records Kafka refused wait out a backoff first.
func (p *pipeline) returnRuns(gen uint64, batch []*flight, h *handoff) {
	runs := map[string]*abortedRun{}
	var firsts []*flight // each run's first record, whose worker owns the key
	for _, f := range batch {
		r := runs[f.rec.KafkaKey]
		if r == nil {
			r = &abortedRun{key: f.rec.KafkaKey, gen: gen}
			runs[r.key] = r
			firsts = append(firsts, f)
		}
		var rejected *RejectedError
		if failure := f.deliveryFailure(); errors.As(failure, &rejected) {
			r.hold = append(r.hold, heldRecord{f: f, backoff: p.rejected(f, failure)})
		}
	}
	for _, f := range firsts {
		h.runs = append(h.runs, *runs[f.rec.KafkaKey])
		h.workers = append(h.workers, f.worker)
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
func (p *pipeline) commitTxn(ctx context.Context, batch, extra []*flight) error {
	for _, f := range batch {
		if failure := f.deliveryFailure(); failure != nil {
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
		err := p.producer.WriteNote(noteCtx, p.notes, p.ledger.note(extra))
		cancel()
		if err != nil {
			return fmt.Errorf("write note: %w", err)
		}
	}
	return p.retry(ctx, p.producer.CommitTransaction)
}

// abortTxn aborts the current transaction, calling again while librdkafka says to.
func (p *pipeline) abortTxn(ctx context.Context) error {
	return p.retry(ctx, p.producer.AbortTransaction)
}

// retry calls a transactional API until it succeeds, fails for good, or ctx ends. Each call gets
// its own deadline (see attempt), so that none outlasts the epoch's final flush; a call that
// fails at once is not repeated at once.
func (p *pipeline) retry(ctx context.Context, call func(context.Context) error) error {
	for {
		callCtx, cancel := p.attempt(ctx)
		err := call(callCtx)
		cancel()
		var txnErr *TxnError
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
func (p *pipeline) attempt(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithDeadline(ctx, p.until(p.limits.MaxPollInterval))
}

// until returns the time d from now, or the end of the epoch's final flush if that comes first.
func (p *pipeline) until(d time.Duration) time.Time {
	t := time.Now().Add(d)
	if end := p.flushDeadline.Load(); end != nil && end.Before(t) {
		return *end
	}
	return t
}

func (p *pipeline) beginTxn() {
	if err := p.producer.BeginTransaction(); err != nil {
		p.requestRemark("begin transaction", err)
	}
}

// commitLoop purges acknowledged records and resets failed ones, in batches: it takes what has
// gathered while the previous statement ran. Only after a purge commits does it release the
// records' keys, so a key's next record is never sent while this one could still be marked
// again.
func (p *pipeline) commitLoop() {
	for {
		first, ok := <-p.outcomes
		if !ok {
			return
		}
		batch := []outcome{first}
	gather:
		for len(batch) < maxCommitBatch {
			select {
			case o, ok := <-p.outcomes:
				if !ok {
					break gather
				}
				batch = append(batch, o)
			default:
				break gather
			}
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
			if p.commit("purge", purge, p.db.Purge) {
				p.metrics.purgeSeconds.Observe(time.Since(began).Seconds())
				p.noted.Add(-int64(p.ledger.forget(purge)))
				p.finish(purge)
			}
		}
		if len(reset) > 0 && p.commit("reset", reset, func(ctx context.Context, ids []int64) (int, error) {
			return p.db.Reset(ctx, p.leaderID, ids)
		}) {
			p.metrics.reset.Add(float64(len(reset)))
		}
	}
}

// commit runs one batched statement, retrying with backoff while the database is unavailable.
// It gives up (returning false) only when the epoch's final flush runs out of time: the rows
// then stay in the outbox and are published again, which duplicates but never reorders.
func (p *pipeline) commit(op string, batch []*flight, exec func(context.Context, []int64) (int, error)) bool {
	ids := make([]int64, len(batch))
	for i, f := range batch {
		ids[i] = f.rec.ID
	}
	ctx := p.flushCtx
	for {
		_, err := exec(ctx, ids)
		if err == nil {
			p.dbTrouble.ok(p.log)
			return true
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
				p.log.Warn("gave up on purge at the end of the epoch; the next epoch this harvester leads purges them first",
					"records", carried, "error", err)
			}
			if len(ids) > carried {
				p.log.Warn("gave up on "+op+" at the end of the epoch; the next epoch marks the records again",
					"records", len(ids)-carried, "error", err)
			}
			return false
		}
		p.dbTrouble.fail(p.log, op, err)
		select {
		case <-time.After(p.limits.IOErrorBackoff):
		case <-ctx.Done():
		}
	}
}

// finish releases the keys of purged records and makes room for more.
func (p *pipeline) finish(batch []*flight) {
	// Any mark that returns these rows again began before now.
	purgedAt := p.marks.Load()
	for _, f := range batch {
		p.untrack(f)
		f.purgedAt = purgedAt
		// Once the epoch is stopping its workers are gone, and the channel, whose room was freed
		// when records were pushed rather than taken, could be full: a send would never return.
		select {
		case f.worker.finished <- f:
		case <-p.ctx.Done():
		}
	}
	p.makeRoom(len(batch))
	p.metrics.purged.Add(float64(len(batch)))
	p.meter.Add(int64(len(batch)))
	if stats, ok := p.meter.Read(); ok {
		p.emit(MeterRead{Stats: stats})
	}
}

// makeRoom takes n records off the in-flight count and wakes the marker if it waits for room.
func (p *pipeline) makeRoom(n int) {
	p.queued.Add(-int64(n))
	select {
	case p.room <- struct{}{}:
	default:
	}
}

// track counts f among the in-flight keys, once however often it is sent.
func (p *pipeline) track(f *flight) {
	if f.tracked {
		return
	}
	f.tracked = true
	p.keysMu.Lock()
	p.keys[f.rec.KafkaKey]++
	p.keysMu.Unlock()
}

func (p *pipeline) untrack(f *flight) {
	p.keysMu.Lock()
	if p.keys[f.rec.KafkaKey]--; p.keys[f.rec.KafkaKey] <= 0 {
		delete(p.keys, f.rec.KafkaKey)
	}
	p.keysMu.Unlock()
}

// inFlight returns the keys with a record out and unfinished, and how many records that is.
func (p *pipeline) inFlight() (keys []string, records int) {
	p.keysMu.Lock()
	defer p.keysMu.Unlock()
	for k, n := range p.keys {
		keys = append(keys, k)
		records += n
	}
	return keys, records
}

// stop ends the epoch: it stops marking and sending, commits the current transaction (or aborts
// it when time runs out), commits the purges and resets that gathered, and returns the ids of
// records committed to Kafka whose purge it had to give up. It returns within about timeout (see
// neli/doc.go for why that matters): every wait below ends by the same deadline, and so does a
// call to the producer's transactional API already under way, which was given at most timeout
// when it began (see attempt). The producer is closed in the background, since closing it may
// wait for a topic lookup; closed is closed once it is.
func (p *pipeline) stop(timeout time.Duration) (unpurged []int64, closed <-chan struct{}) {
	deadline := time.Now().Add(timeout)
	p.flushDeadline.Store(&deadline)
	giveUp := time.AfterFunc(timeout, p.flushCancel)
	defer giveUp.Stop()
	defer p.flushCancel()

	p.cancel()
	p.sending.Wait()
	p.endTxn(p.flushCtx, false)

	if !p.awaitReports(deadline) {
		p.log.Warn("in-flight records not reported in time; abandoning them (they will be published again)",
			"records", p.unreported.Load(), "waited", timeout)
		p.producer.Abandon()
	}
	close(p.outcomes)
	p.committing.Wait()

	done := make(chan struct{})
	go func() {
		defer close(done)
		p.producer.Close()
		p.delivering.Wait()
	}()
	p.unpurgedMu.Lock()
	defer p.unpurgedMu.Unlock()
	return p.unpurged, done
}

// awaitReports waits until every produced message has been reported, or until deadline.
func (p *pipeline) awaitReports(deadline time.Time) bool {
	for p.unreported.Load() > 0 {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
	return true
}

// headerCarrier lets OpenTelemetry read a record's headers.
type headerCarrier KafkaHeaders

func (c headerCarrier) Get(key string) string {
	for _, h := range c {
		if h.Key == key {
			return h.Value
		}
	}
	return ""
}

func (c headerCarrier) Set(string, string) {}

func (c headerCarrier) Keys() []string {
	keys := make([]string, len(c))
	for i, h := range c {
		keys[i] = h.Key
	}
	return keys
}

// startSpan begins the record's publish span, once, linked to the trace in its traceparent
// header (the request that wrote it), when tracing is on.
func (p *pipeline) startSpan(f *flight) {
	if p.tracer == nil || f.span != nil {
		return
	}
	written := propagation.TraceContext{}.Extract(context.Background(), headerCarrier(f.rec.KafkaHeaders))
	_, f.span = p.tracer.Start(context.Background(), "publish "+f.rec.KafkaTopic,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithLinks(trace.LinkFromContext(written)),
		trace.WithAttributes(
			attribute.String("messaging.system", "kafka"),
			attribute.String("messaging.destination.name", f.rec.KafkaTopic),
			attribute.Int64("goharvest.record.id", f.rec.ID),
			attribute.String("goharvest.leader.id", p.leaderID.String()),
		))
}

// endSpan ends the record's publish span, if any: committed (err nil) or given up in this epoch.
func (p *pipeline) endSpan(f *flight, err error) {
	if f.span == nil {
		return
	}
	if err != nil {
		f.span.RecordError(err)
		f.span.SetStatus(codes.Error, err.Error())
	}
	f.span.End()
	f.span = nil
}
