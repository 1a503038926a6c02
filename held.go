package goharvest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Held keys. A record that cannot be published (Kafka or goharvest refused it, or its row is
// malformed) holds back its key: the key's later records wait behind it. This file keeps that
// from costing any other key anything, and lets an operator's fix or delete take effect at once.
//
//   - A held key's records from the held one on do not count against MaxInFlightRecords (the
//     flight's free flag), and the marker marks no more of its rows (HeldRowBinding.MarkExcept),
//     so however many rows a held key has, the budget stays with the other keys. A row of a held
//     key that was never marked stays unmarked, so it cannot overtake the held record; once the
//     key is released the marker takes its rows from the head, in id order, as for any key.
//   - Nothing past a held record is sent until it is purged, dropped or dead-lettered.
//   - The held loop reads every held row afresh, in one query, every HeldCheckInterval, and at
//     once when a held record's backoff is over: a held record is sent again only with content
//     read after its last attempt. A deleted row is dropped and its key released; a changed row
//     is sent at once with its new content; an unchanged one waits out its backoff.
//   - A transaction that carries re-read records checks, once the producer has delivered it and
//     just before it commits, that their rows are still the versions read (checkReread): an
//     operator's change or delete that landed while the old content waited in the producer aborts
//     it, and the record is read and sent again. A change in the instant between that check and
//     the commit is caught by the purge: a re-read record is purged only if its row is still the
//     version read (HeldRowBinding.PurgeUnchanged, on a hash of the row's message columns), otherwise it is read
//     again and its new content published after the old, so a correction is never lost. (A
//     delete in that instant cannot unpublish the record.) Runs never grow past a re-read record,
//     so that resending it cannot follow a later record of its key.
//   - With dead letters on (Limits.DeadLetterAttempts, DeadLetterAfter), a held record past
//     either limit is no longer sent, and the held loop moves its row into the dead-letter table
//     in one statement; the key is then released.

// HeldRowBinding is implemented by bindings that support the held-record machinery
// (PostgresBinding does). Without it, held keys still hold only themselves in the in-flight
// budget, but their unmarked rows keep being marked, and held rows are read afresh only in the
// next epoch.
type HeldRowBinding interface {
	// MarkExcept is Mark, leaving alone the rows whose kafka_key is one of heldKeys.
	MarkExcept(ctx context.Context, leaderID uuid.UUID, limit int, heldKeys []string) ([]MarkedRecord, error)
	// Reread reads the rows with the given ids afresh, with their versions; rows that no longer
	// exist are missing from the result.
	Reread(ctx context.Context, ids []int64) ([]RereadRecord, error)
	// PurgeUnchanged deletes each row whose version is still the given one, and returns the ids
	// it deleted.
	PurgeUnchanged(ctx context.Context, versions map[int64]string) ([]int64, error)
	// DeadLetter moves the row with the given id, if its version is still version, from the
	// outbox into the dead-letter table (see DeadLetterTable) in one transaction, and reports
	// whether it did.
	DeadLetter(ctx context.Context, id int64, version string, d DeadLetterInfo) (bool, error)
}

// RereadRecord is a row read afresh, with its version: a value that changes whenever the row is
// updated (a hash of the columns that make the message).
type RereadRecord struct {
	MarkedRecord
	Version string
}

// DeadLetterInfo is what the dead-letter table records about a row besides its columns.
type DeadLetterInfo struct {
	Err          string
	Attempts     int
	FirstFailure time.Time
	LastFailure  time.Time
}

// HeldRecord describes a record that holds back its key (see Harvest.HeldRecords).
type HeldRecord struct {
	ID       int64     `json:"id"`
	Topic    string    `json:"topic"`
	Key      string    `json:"key"`
	Attempts int       `json:"attempts"`
	Error    string    `json:"error"`
	Since    time.Time `json:"since"`
}

// heldEntry is the registry's view of one held record. The worker that owns the record writes
// it; the held loop, the metrics and HeldRecords read it.
type heldEntry struct {
	HeldRecord
	f    *flight
	last time.Time
	// doom is set (with the version read) when the worker has given up on the record: the held
	// loop moves it into the dead-letter table.
	doom    bool
	version string
}

// heldSet is the pipeline's registry of held records and keys.
type heldSet struct {
	mu      sync.Mutex
	keys    map[string]int // held key -> records of it in the registry
	records map[int64]*heldEntry
}

func (s *heldSet) put(f *flight, key string, err error, doom bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.records == nil {
		s.records, s.keys = map[int64]*heldEntry{}, map[string]int{}
	}
	e := s.records[f.rec.ID]
	if e == nil {
		e = &heldEntry{f: f}
		s.records[f.rec.ID] = e
		s.keys[key]++
	}
	e.HeldRecord = HeldRecord{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: key, Attempts: f.attempts,
		Since: f.firstFailure}
	if err != nil {
		e.Error = err.Error()
	}
	e.last = time.Now()
	e.doom, e.version = doom, f.version
}

func (s *heldSet) remove(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e := s.records[id]; e != nil {
		delete(s.records, id)
		if s.keys[e.Key]--; s.keys[e.Key] <= 0 {
			delete(s.keys, e.Key)
		}
	}
}

// heldKeys returns the keys the marker must leave alone.
func (s *heldSet) heldKeys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.keys))
	for k := range s.keys {
		keys = append(keys, k)
	}
	return keys
}

// list returns the held records, oldest first.
func (s *heldSet) list() []HeldRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]HeldRecord, 0, len(s.records))
	for _, e := range s.records {
		out = append(out, e.HeldRecord)
	}
	slices.SortFunc(out, func(a, b HeldRecord) int { return a.Since.Compare(b.Since) })
	return out
}

func (s *heldSet) snapshot() []heldEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]heldEntry, 0, len(s.records))
	for _, e := range s.records {
		out = append(out, *e)
	}
	return out
}

// failureMemo remembers, across the epochs of one harvester, when each held record first failed
// and how many attempts it has had, so that the dead-letter limits are not reset by a remark.
// A record is forgotten once it is purged, dropped or dead-lettered while held. One that a later
// epoch publishes at its first try stays (ids are never reused, so that costs an entry per
// record ever held, and keeps the purge path free of this lock).
type failureMemo struct {
	mu sync.Mutex
	m  map[int64]failureNote
}

type failureNote struct {
	first    time.Time
	attempts int
}

func (m *failureMemo) recall(id int64) (failureNote, bool) {
	if m == nil {
		return failureNote{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.m[id]
	return n, ok
}

func (m *failureMemo) note(id int64, first time.Time, attempts int) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = map[int64]failureNote{}
	}
	m.m[id] = failureNote{first: first, attempts: attempts}
}

func (m *failureMemo) forget(id int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, id)
}

// mark marks the next batch, leaving alone the rows of held keys when the binding can.
func (p *pipeline) mark(ctx context.Context, limit int) ([]MarkedRecord, error) {
	if b, ok := p.db.(HeldRowBinding); ok {
		return b.MarkExcept(ctx, p.leaderID, limit, p.held.heldKeys())
	}
	return p.db.Mark(ctx, p.leaderID, limit)
}

// index returns the position of f in q, or -1.
func (q *keyQueue) index(f *flight) int { return slices.Index(q.flights, f) }

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
		if earlier, ok := w.p.failures.recall(f.rec.ID); ok {
			// Held in an earlier epoch: the dead-letter limits count from its first failure.
			f.firstFailure = earlier.first
			f.attempts += earlier.attempts
		}
	}
	w.p.failures.note(f.rec.ID, f.firstFailure, f.attempts)
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

// key returns the queue's key.
func (q *keyQueue) key() string { return q.flights[0].rec.KafkaKey }

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
		w.p.failures.forget(q.held.rec.ID)
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
		if _, ok := w.p.db.(HeldRowBinding); ok {
			f.held, f.due = true, true
			w.p.wakeHeldLoop()
			return false
		}
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
		if _, ok := w.p.db.(HeldRowBinding); ok {
			f.due = true
			w.p.wakeHeldLoop()
			return
		}
	}
	f.held = false
	w.pump(q)
}

// verdict is what the held loop found of a held record's row.
type verdict struct {
	f       *flight
	kind    verdictKind
	rec     MarkedRecord // the row read afresh (verdictRead)
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
		p.metrics.heldDeleted.Inc()
		p.log.Warn("held outbox record deleted (or given another key) in the outbox; dropped it and released its key", attrs...)
		p.emit(HeldRecordDeleted{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: f.rec.KafkaKey})
	case verdictDeadLettered:
		w.drop(q, f)
		p.metrics.deadLettered.Inc()
		p.log.Error("held outbox record moved to the dead-letter table; its key's later records are published without it",
			append(attrs, "attempts", f.attempts, "error", f.lastErr)...)
		p.emit(RecordDeadLettered{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: f.rec.KafkaKey, Attempts: f.attempts, Err: f.lastErr})
	case verdictRead:
		f.version = v.version
		if !sameContent(f.rec, v.rec) {
			p.log.Info("held outbox record changed in the outbox; sending its new content", attrs...)
			f.rec, f.fresh, f.held, f.due, f.doomed = v.rec, true, false, false, false
			if f.rec.Err != nil {
				f.fresh, f.held = false, true
				w.hold(q, f, f.rec.Err)
				p.log.Error("outbox record cannot be published; holding back its key", append(attrs, "error", f.rec.Err)...)
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
	l := w.p.limits
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
	p.failures.forget(f.rec.ID)
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

// sameContent reports whether two reads of a row would publish the same message.
func sameContent(a, b MarkedRecord) bool {
	errText := func(e error) string {
		if e == nil {
			return ""
		}
		return e.Error()
	}
	return a.KafkaTopic == b.KafkaTopic && a.KafkaKey == b.KafkaKey &&
		(a.KafkaValue == nil) == (b.KafkaValue == nil) && (a.KafkaValue == nil || *a.KafkaValue == *b.KafkaValue) &&
		slices.Equal(a.KafkaHeaders, b.KafkaHeaders) && errText(a.Err) == errText(b.Err)
}

func (p *pipeline) wakeHeldLoop() { p.heldWake.poke() }

// heldLoop reads the held rows afresh and moves the doomed ones to the dead-letter table: every
// HeldCheckInterval, and when a worker asks.
func (p *pipeline) heldLoop(b HeldRowBinding) {
	tick := time.NewTicker(p.limits.HeldCheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-tick.C:
		case <-p.heldWake:
		}
		entries := p.held.snapshot()
		if len(entries) == 0 {
			continue
		}
		p.deadLetter(b, entries)
		p.reread(b, entries)
	}
}

// deadLetter moves the doomed records' rows into the dead-letter table.
func (p *pipeline) deadLetter(b HeldRowBinding, entries []heldEntry) {
	for _, e := range entries {
		if !e.doom {
			continue
		}
		moved, err := b.DeadLetter(p.ctx, e.ID, e.version, DeadLetterInfo{Err: e.Error, Attempts: e.Attempts,
			FirstFailure: e.Since, LastFailure: e.last})
		if err != nil {
			if p.ctx.Err() == nil {
				p.deadTrouble.Fail(p.log, fmt.Sprintf("move record %d (has `reaper init` created the table?)", e.ID), err)
			}
			continue
		}
		p.deadTrouble.OK(p.log)
		if moved {
			p.sendVerdict(verdict{f: e.f, kind: verdictDeadLettered})
		} // else the row changed or went: the read that follows finds out
	}
}

// reread reads the held rows in one query and tells their workers what it found.
func (p *pipeline) reread(b HeldRowBinding, entries []heldEntry) {
	ids := make([]int64, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
	}
	var rows []RereadRecord
	for chunk := range slices.Chunk(ids, maxCommitBatch) {
		read, err := b.Reread(p.ctx, chunk)
		if err != nil {
			if p.ctx.Err() == nil {
				p.dbTrouble.Fail(p.log, "read held records", err)
			}
			return
		}
		rows = append(rows, read...)
	}
	p.dbTrouble.OK(p.log)
	found := make(map[int64]RereadRecord, len(rows))
	for _, r := range rows {
		found[r.ID] = r
	}
	var moved []int64
	for _, e := range entries {
		if r, ok := found[e.ID]; ok && r.KafkaKey != e.Key {
			moved = append(moved, e.ID)
		}
	}
	if len(moved) > 0 {
		// The row now belongs to another key's order: it is reset, to be marked with that key's rows.
		if _, err := p.db.Reset(p.ctx, p.leaderID, moved); err != nil {
			return
		}
	}
	for _, e := range entries {
		r, ok := found[e.ID]
		switch {
		case !ok:
			p.sendVerdict(verdict{f: e.f, kind: verdictDeleted})
		case r.KafkaKey != e.Key:
			p.sendVerdict(verdict{f: e.f, kind: verdictMoved})
		default:
			p.sendVerdict(verdict{f: e.f, kind: verdictRead, rec: r.MarkedRecord, version: r.Version})
		}
	}
}

// sendVerdict tells the worker of a held record what the held loop found of its row.
func (p *pipeline) sendVerdict(v verdict) { v.f.worker.tell(workerMsg{verdict: &v}) }

// rereadCheckTimeout bounds the version check before a commit (checkReread).
const rereadCheckTimeout = time.Second

// checkReread makes a transaction that carries records read afresh fail (to be aborted and sent
// again) when one of their rows has changed or gone since it was read, so that an operator's fix
// or delete that lands while the old content waits in the producer's queue does not see that
// content committed. It first waits for the producer to deliver the transaction, so that only
// the commit itself follows the check; should a change land in that last moment, the purge's
// version check still keeps the row (purgeChecked). A check that cannot be made lets the commit
// go ahead, for the same reason.
func (p *pipeline) checkReread(ctx context.Context, batch []*flight) error {
	b, ok := p.db.(HeldRowBinding)
	if !ok {
		return nil
	}
	versions := map[int64]string{}
	for _, f := range batch {
		if f.version != "" {
			versions[f.rec.ID] = f.version
		}
	}
	if len(versions) == 0 {
		return nil
	}
	if deadline, ok := ctx.Deadline(); ok {
		p.activity.awaitReports(deadline)
	}
	ids := make([]int64, 0, len(versions))
	for id := range versions {
		ids = append(ids, id)
	}
	// The check runs while no record can be produced; a database that does not answer at once
	// must not stall every key, and the purge's version check remains.
	checkCtx, cancel := context.WithTimeout(ctx, rereadCheckTimeout)
	defer cancel()
	rows, err := b.Reread(checkCtx, ids)
	if err != nil {
		return nil
	}
	for _, r := range rows {
		if versions[r.ID] == r.Version {
			delete(versions, r.ID)
		}
	}
	for id := range versions {
		return &RejectedError{ByGoharvest: true,
			Err: fmt.Errorf("outbox record %d changed or was deleted after it was read; its old content is not committed", id)}
	}
	return nil
}

// purgeChecked purges the records whose rows were read afresh only if each row is still the
// version read, and returns the other records, to be purged as usual. A record whose row changed
// or went after it was read goes back to its worker (see unpurged).
func (p *pipeline) purgeChecked(batch []*flight) []*flight {
	b, ok := p.db.(HeldRowBinding)
	if !ok || !slices.ContainsFunc(batch, func(f *flight) bool { return f.version != "" }) {
		return batch
	}
	var plain, checked []*flight
	for _, f := range batch {
		if f.version != "" {
			checked = append(checked, f)
		} else {
			plain = append(plain, f)
		}
	}
	versions := make(map[int64]string, len(checked))
	for _, f := range checked {
		versions[f.rec.ID] = f.version
	}
	var purged []int64
	ok = p.commit("purge", checked, func(ctx context.Context, _ []int64) (int, error) {
		var err error
		purged, err = b.PurgeUnchanged(ctx, versions)
		return len(purged), err
	})
	if !ok {
		return plain
	}
	var done []*flight
	for _, f := range checked {
		if slices.Contains(purged, f.rec.ID) {
			done = append(done, f)
			continue
		}
		p.log.Warn("outbox record changed after it was read and published; publishing it again", "id", f.rec.ID,
			"topic", f.rec.KafkaTopic, "key", f.rec.KafkaKey)
		f.worker.tell(workerMsg{stale: f})
	}
	if len(done) > 0 {
		p.ledger.forget(done)
		p.finish(done)
	}
	return plain
}

// HeldRecords returns the records that hold back their keys now, oldest first; empty when this
// harvester does not lead.
func (h *Harvest) HeldRecords() []HeldRecord {
	list := []HeldRecord{}
	for _, p := range h.epochs() {
		list = append(list, p.held.list()...)
	}
	slices.SortStableFunc(list, func(a, b HeldRecord) int { return a.Since.Compare(b.Since) })
	return list
}

// heldStats returns how many records are held and when the oldest first failed.
func (h *Harvest) heldStats() (int, time.Time) {
	list := h.HeldRecords()
	if len(list) == 0 {
		return 0, time.Time{}
	}
	return len(list), list[0].Since
}
