package epoch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/mailbox"
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

// heldEntry is the registry's view of one held record. The worker that owns the record writes
// it; the held loop, the metrics and HeldRecords read it.
type heldEntry struct {
	event.HeldRecord
	f    *flight
	last time.Time
	// doom is set (with the version read) when the worker has given up on the record: the held
	// loop moves it into the dead-letter table.
	doom    bool
	version string
	// unauthorized: Kafka refused this client the record's topic (driver.RejectedError).
	unauthorized bool
}

// heldSet is the pipeline's registry of held records and keys.
type heldSet struct {
	// added is poked whenever a record enters the registry: the held loop ticks only while
	// something is held.
	added   mailbox.Wake
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
		s.added.Poke()
	}
	e.HeldRecord = event.HeldRecord{ID: f.rec.ID, Topic: f.rec.KafkaTopic, Key: key, Attempts: f.attempts,
		Since: f.firstFailure}
	if err != nil {
		e.Error = err.Error()
		var rejected *driver.RejectedError
		e.unauthorized = errors.As(err, &rejected) && rejected.Unauthorized
	}
	e.last = time.Now()
	e.doom, e.version = doom, f.version
}

// unauthorized returns, by topic, how many held records Kafka refused because this client may
// not write their topic, with the first such refusal.
func (s *heldSet) unauthorized() map[string]heldRefusal {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]heldRefusal{}
	for _, e := range s.records {
		if !e.unauthorized {
			continue
		}
		r := out[e.Topic]
		if r.records == 0 {
			r.err = e.Error
		}
		r.records++
		out[e.Topic] = r
	}
	return out
}

// heldRefusal is what Kafka's refusals of one topic hold back.
type heldRefusal struct {
	records int
	err     string
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
func (s *heldSet) list() []event.HeldRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]event.HeldRecord, 0, len(s.records))
	for _, e := range s.records {
		out = append(out, e.HeldRecord)
	}
	slices.SortFunc(out, func(a, b event.HeldRecord) int { return a.Since.Compare(b.Since) })
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

// Failures remembers, across the epochs of one harvester, when each held record first failed
// and how many attempts it has had, so that the dead-letter limits are not reset by a remark.
// A record is forgotten once it is purged, dropped or dead-lettered while held. One that a later
// epoch publishes at its first try stays (ids are never reused, so that costs an entry per
// record ever held, and keeps the purge path free of this lock).
type Failures struct {
	mu sync.Mutex
	m  map[int64]failureNote
}

type failureNote struct {
	first    time.Time
	attempts int
}

func (m *Failures) recall(id int64) (failureNote, bool) {
	if m == nil {
		return failureNote{}, false
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.m[id]
	return n, ok
}

func (m *Failures) note(id int64, first time.Time, attempts int) {
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

func (m *Failures) forget(id int64) {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.m, id)
}

// sameContent reports whether two reads of a row would publish the same message.
func sameContent(a, b driver.MarkedRecord) bool {
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

func (p *Epoch) wakeHeldLoop() { p.heldWake.Poke() }

// heldLoop reads the held rows afresh and moves the doomed ones to the dead-letter table: every
// HeldCheckInterval while a record is held, and when a worker asks. With nothing held it does not
// tick: the first record held starts the ticker (heldSet.put). One reaper may run many idle
// outboxes, and what an idle outbox costs it is mostly such wakes, not the work done in them.
func (p *Epoch) heldLoop() {
	var tick *time.Ticker
	defer func() {
		if tick != nil {
			tick.Stop()
		}
	}()
	for {
		var ticks <-chan time.Time
		if tick != nil {
			ticks = tick.C
		}
		select {
		case <-p.ctx.Done():
			return
		case <-p.held.added:
			if tick == nil {
				tick = time.NewTicker(p.Limits.HeldCheckInterval)
			}
			continue
		case <-ticks:
		case <-p.heldWake:
		}
		entries := p.held.snapshot()
		if len(entries) == 0 {
			// A record held after the snapshot has poked added, which starts the ticker again.
			if tick != nil {
				tick.Stop()
				tick = nil
			}
			continue
		}
		p.deadLetter(entries)
		p.reread(entries)
	}
}

// deadLetter moves the doomed records' rows into the dead-letter table.
func (p *Epoch) deadLetter(entries []heldEntry) {
	for _, e := range entries {
		if !e.doom {
			continue
		}
		moved, err := p.Store.DeadLetter(p.ctx, e.ID, e.version, driver.DeadLetterInfo{Err: e.Error, Attempts: e.Attempts,
			FirstFailure: e.Since, LastFailure: e.last})
		if err != nil {
			if p.ctx.Err() == nil {
				p.deadTrouble.Fail(p.Log, fmt.Sprintf("move record %d (has `reaper init` created the table?)", e.ID), err)
			}
			continue
		}
		p.deadTrouble.OK(p.Log)
		if moved {
			p.sendVerdict(verdict{f: e.f, kind: verdictDeadLettered})
		} // else the row changed or went: the read that follows finds out
	}
}

// reread reads the held rows in one query and tells their workers what it found.
func (p *Epoch) reread(entries []heldEntry) {
	ids := make([]int64, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
	}
	var rows []driver.RereadRecord
	for chunk := range slices.Chunk(ids, MaxCommitBatch) {
		read, err := p.Store.Reread(p.ctx, chunk)
		if err != nil {
			if p.ctx.Err() == nil {
				p.DBTrouble.Fail(p.Log, "read held records", err)
			}
			return
		}
		rows = append(rows, read...)
	}
	p.DBTrouble.OK(p.Log)
	found := make(map[int64]driver.RereadRecord, len(rows))
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
		// The row now belongs to another key's order: it is released, to be claimed with that key's
		// rows.
		if err := p.Claim.Release(p.ctx, moved); err != nil {
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
func (p *Epoch) sendVerdict(v verdict) { v.f.worker.tell(workerMsg{verdict: &v}) }

// rereadCheckTimeout bounds the version check before a commit (checkReread).
const rereadCheckTimeout = time.Second

// checkReread makes a transaction that carries records read afresh fail (to be aborted and sent
// again) when one of their rows has changed or gone since it was read, so that an operator's fix
// or delete that lands while the old content waits in the producer's queue does not see that
// content committed. It first waits for the producer to deliver the transaction, so that only
// the commit itself follows the check; should a change land in that last moment, the purge's
// version check still keeps the row (purgeChecked). A check that cannot be made lets the commit
// go ahead, for the same reason.
func (p *Epoch) checkReread(ctx context.Context, batch []*flight) error {
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
	rows, err := p.Store.Reread(checkCtx, ids)
	if err != nil {
		return nil
	}
	for _, r := range rows {
		if versions[r.ID] == r.Version {
			delete(versions, r.ID)
		}
	}
	for id := range versions {
		return &driver.RejectedError{ByGoharvest: true,
			Err: fmt.Errorf("outbox record %d changed or was deleted after it was read; its old content is not committed", id)}
	}
	return nil
}

// purgeChecked purges the records whose rows were read afresh only if each row is still the
// version read, and returns the other records, to be purged as usual. A record whose row changed
// or went after it was read goes back to its worker (see unpurged).
func (p *Epoch) purgeChecked(batch []*flight) []*flight {
	if !slices.ContainsFunc(batch, func(f *flight) bool { return f.version != "" }) {
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
	ok := p.commit("purge", checked, func(ctx context.Context, _ []int64) (int, error) {
		var err error
		purged, err = p.Store.PurgeUnchanged(ctx, versions)
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
		p.Log.Warn("outbox record changed after it was read and published; publishing it again", "id", f.rec.ID,
			"topic", f.rec.KafkaTopic, "key", f.rec.KafkaKey)
		f.worker.tell(workerMsg{stale: f})
	}
	if len(done) > 0 {
		p.ledger.forget(done)
		p.finish(done)
	}
	return plain
}
