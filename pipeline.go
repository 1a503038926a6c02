package goharvest

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/metric"
)

// The pipeline publishes one leader epoch: everything it does carries one leader ID and goes
// through one producer, and it is drained and closed before the next epoch starts, so nothing
// from an old epoch can be delivered after a new one has begun.
//
//	marker ──> send workers (sharded by key) ──> producer ──> delivery reader
//	              ^                                                │
//	              └──────── key finished <── committers (purge) <──┘
//
// The marker marks batches from the head of the outbox while the pipeline has room
// (MaxInFlightRecords counts every record marked and not yet finished), and hands each record
// to the send worker that owns its key. A worker keeps a queue per key and has at most one
// record per key with Kafka: the next is sent only once the previous has been acknowledged and
// its purge has committed. The delivery reader passes acknowledgements to the committers, which
// purge them in batches (one DELETE for many rows, while the next batch gathers) and then tell
// the workers. A record Kafka refused outright is retried with backoff, holding back only its
// own key. Any other failure resets the record and asks for a remark: the owner ends the epoch
// and starts another under a new leader ID, which marks everything not yet purged again, from
// the head, in order.

const (
	// committers is how many purge statements may run at once; with two, one gathers a batch
	// while the other executes.
	committers = 2
	// maxCommitBatch bounds the ids in one purge or reset statement.
	maxCommitBatch = 5000
	// maxRetryBackoff bounds the wait before retrying a record Kafka refused.
	maxRetryBackoff = time.Minute
	// queueFullBackoff is the wait before retrying a message the producer had no room for.
	queueFullBackoff = 10 * time.Millisecond
)

// flight is one record on its way through the pipeline.
type flight struct {
	rec      MarkedRecord
	worker   *sendWorker
	attempts int
	tracked  bool // counted among the in-flight keys
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
	// leading reports whether this harvester may still publish; workers ask before each send.
	leading func() bool
}

type pipeline struct {
	pipelineDeps

	ctx    context.Context // cancelled to stop marking and sending
	cancel context.CancelFunc
	// dbCtx bounds purges and resets: cancelled only when the epoch's final flush runs out of
	// time, which also interrupts a statement stuck on a locked table.
	dbCtx    context.Context
	dbCancel context.CancelFunc

	workers  []*sendWorker
	outcomes chan outcome // from the delivery reader to the committers

	queued     atomic.Int64  // marked and not finished: bounded by MaxInFlightRecords
	unreported atomic.Int64  // produced, delivery not yet reported
	room       chan struct{} // one slot: wakes the marker when records finish

	remarkOnce sync.Once
	remarkCh   chan struct{} // closed when the epoch should end with a remark
	remarkErr  atomic.Bool   // the remark was caused by an error: back off before the next epoch

	keysMu sync.Mutex
	keys   map[string]int // keys with a record sent (or held for retry) and not finished

	sending    sync.WaitGroup // marker and workers
	delivering sync.WaitGroup // delivery reader
	committing sync.WaitGroup // committers
}

func startPipeline(deps pipelineDeps) *pipeline {
	ctx, cancel := context.WithCancel(context.Background())
	dbCtx, dbCancel := context.WithCancel(context.Background())
	max := deps.limits.MaxInFlightRecords
	p := &pipeline{
		pipelineDeps: deps,
		ctx:          ctx,
		cancel:       cancel,
		dbCtx:        dbCtx,
		dbCancel:     dbCancel,
		outcomes:     make(chan outcome, max),
		room:         make(chan struct{}, 1),
		remarkCh:     make(chan struct{}),
		keys:         map[string]int{},
	}
	for range deps.limits.SendConcurrency {
		w := &sendWorker{
			p:        p,
			in:       make(chan *flight, deps.limits.SendBuffer),
			finished: make(chan *flight, max),
			retry:    make(chan *flight, max),
			queues:   map[string][]*flight{},
		}
		p.workers = append(p.workers, w)
		p.sending.Go(w.run)
	}
	p.sending.Go(p.markLoop)
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
			p.sleep(p.limits.DrainInterval, p.room)
			continue
		}
		records, err := p.db.Mark(p.ctx, p.leaderID, min(room, p.limits.MarkQueryRecords))
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
			p.sleep(idle, nil)
			idle = min(2*idle, p.limits.MaxMarkBackoff)
			continue
		}
		idle = p.limits.MarkBackoff
		p.queued.Add(int64(len(records)))
		for _, rec := range records {
			w := p.workers[shardOf(rec.KafkaKey, len(p.workers))]
			select {
			case w.in <- &flight{rec: rec, worker: w}:
			case <-p.ctx.Done():
				return
			}
		}
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

// sendWorker owns the keys that hash to it: it keeps their records in order, and lets at most
// one record per key be with Kafka.
type sendWorker struct {
	p        *pipeline
	in       chan *flight // marked records, from the marker
	finished chan *flight // purged records, from the committers
	retry    chan *flight // records to send again, after a backoff
	queues   map[string][]*flight
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
			w.queues[f.rec.KafkaKey] = append(q, f)
			if len(q) == 0 {
				w.send(f)
			}
		case f := <-w.finished:
			key := f.rec.KafkaKey
			q := w.queues[key][1:]
			if len(q) == 0 {
				delete(w.queues, key)
			} else {
				w.queues[key] = q
				w.send(q[0])
			}
		case f := <-w.retry:
			w.send(f)
		}
	}
}

// send publishes the record at the head of its key's queue.
func (w *sendWorker) send(f *flight) {
	p := w.p
	if f.rec.Err != nil {
		// A malformed row cannot be published; it holds back its key until the next epoch reads it
		// afresh (after an operator has fixed or deleted it).
		f.attempts++
		p.track(f)
		p.log.Error("outbox record cannot be published; holding back its key", "id", f.rec.ID,
			"topic", f.rec.KafkaTopic, "key", f.rec.KafkaKey, "error", f.rec.Err)
		p.emit(RecordFailed{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: f.rec.KafkaKey, Attempts: f.attempts, Err: f.rec.Err})
		return
	}
	if !p.leading() {
		return // the owner is about to end this epoch
	}
	var value []byte
	if f.rec.KafkaValue != nil {
		value = []byte(*f.rec.KafkaValue)
	}
	f.attempts++
	p.track(f)
	p.unreported.Add(1)
	err := p.producer.Produce(Message{
		Topic:   f.rec.KafkaTopic,
		Key:     []byte(f.rec.KafkaKey),
		Value:   value,
		Headers: f.rec.KafkaHeaders,
		Opaque:  f,
	})
	if err == nil {
		return
	}
	p.unreported.Add(-1)
	if errors.Is(err, ErrQueueFull) {
		f.attempts--
		w.retryAfter(f, queueFullBackoff)
		return
	}
	p.rejected(f, err)
}

// retryAfter sends f again after d, unless the epoch ends first.
func (w *sendWorker) retryAfter(f *flight, d time.Duration) {
	time.AfterFunc(d, func() {
		select {
		case w.retry <- f:
		case <-w.p.ctx.Done():
		}
	})
}

// rejected handles a record that Kafka (or the producer) refused as it stands: it is reported
// and retried with backoff while its key waits.
func (p *pipeline) rejected(f *flight, err error) {
	backoff := min(p.limits.IOErrorBackoff<<min(f.attempts-1, 16), maxRetryBackoff)
	p.log.Warn("outbox record rejected; holding back its key and retrying", "id", f.rec.ID,
		"topic", f.rec.KafkaTopic, "key", f.rec.KafkaKey, "attempt", f.attempts, "retryIn", backoff, "error", err)
	p.emit(RecordFailed{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: f.rec.KafkaKey, Attempts: f.attempts, Err: err})
	f.worker.retryAfter(f, backoff)
}

// readDeliveries routes each delivery report until the producer is closed.
func (p *pipeline) readDeliveries() {
	for d := range p.producer.Deliveries() {
		f := d.Opaque.(*flight)
		p.unreported.Add(-1)
		var rejected *RejectedError
		switch {
		case d.Err == nil:
			p.outcomes <- outcome{f: f}
		case errors.As(d.Err, &rejected) && p.ctx.Err() == nil:
			p.rejected(f, d.Err)
		default:
			// The record may or may not have landed. Its key stays held for the rest of the epoch;
			// the next epoch publishes it again first (a duplicate at worst, never a reversal).
			p.outcomes <- outcome{f: f, failed: true}
			if p.ctx.Err() == nil {
				p.requestRemark("delivery failed", d.Err)
			}
		}
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
		if len(purge) > 0 && p.commit("purge", purge, p.db.Purge) {
			p.finish(purge)
		}
		if len(reset) > 0 {
			p.commit("reset", reset, func(ctx context.Context, ids []int64) (int, error) {
				return p.db.Reset(ctx, p.leaderID, ids)
			})
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
	ctx := p.dbCtx
	for {
		_, err := exec(ctx, ids)
		if err == nil {
			p.dbTrouble.ok(p.log)
			return true
		}
		if ctx.Err() != nil {
			p.log.Warn("gave up on "+op+" at the end of the epoch; the records will be published again",
				"records", len(ids), "error", err)
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
	for _, f := range batch {
		p.untrack(f)
		f.worker.finished <- f
	}
	p.queued.Add(-int64(len(batch)))
	select {
	case p.room <- struct{}{}:
	default:
	}
	p.meter.Add(int64(len(batch)))
	if stats, ok := p.meter.Read(); ok {
		p.emit(MeterRead{Stats: stats})
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

// stop ends the epoch within about timeout: it stops marking and sending, waits for Kafka to
// report on everything sent (abandoning what is left when time runs out), commits the purges
// and resets that gathered, and closes the producer.
func (p *pipeline) stop(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	giveUp := time.AfterFunc(timeout, p.dbCancel)
	defer giveUp.Stop()
	defer p.dbCancel()

	p.cancel()
	p.sending.Wait()

	if !p.awaitReports(deadline) {
		p.log.Warn("in-flight records not acknowledged in time; abandoning them (they will be published again)",
			"records", p.unreported.Load(), "waited", timeout)
		p.producer.Abandon()
		// Abandoned messages are reported promptly, as failures.
		p.awaitReports(time.Now().Add(time.Second))
	}
	p.producer.Close()
	p.delivering.Wait()
	close(p.outcomes)
	p.committing.Wait()
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
