package owner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/epoch"
	"github.com/goharvest/goharvest/outbox"
	"github.com/google/uuid"
)

// fakeDB is an in-memory outbox with the semantics of the Postgres binding.
type fakeDB struct {
	mu     sync.Mutex
	rows   map[int64]*driver.OutboxRecord
	nextID int64
	down   bool // every call fails while set
	// failPurges makes purges fail while set, as if the leader stopped after a commit and
	// before its purge.
	failPurges bool
	// failPurgesFromRun sets failPurges at the first purge of two records of one key: a run its
	// transaction's note lists.
	failPurgesFromRun bool
	marks             int
	purges            int
	purged            []int64
	failMk            int // fail this many coming marks
	markErr           map[int64]error
	// purgeDelay is the time a purge takes, as a round trip to a real database would.
	purgeDelay time.Duration
	// markDelay is the time a mark takes.
	markDelay time.Duration
	// hang makes every call block until its context ends, as on a locked table.
	hang bool
	// versions counts the updates of each row other than marking (held.go's row versions).
	versions map[int64]int
	// deadLetters holds the rows moved to the dead-letter table.
	deadLetters map[int64]driver.DeadLetterInfo
	rereads     int
}

func (d *fakeDB) setHang(hang bool) {
	d.mu.Lock()
	d.hang = hang
	d.mu.Unlock()
}

// wait blocks while the database hangs, as a statement waits for a lock, until ctx ends.
func (d *fakeDB) wait(ctx context.Context) error {
	for {
		d.mu.Lock()
		hang := d.hang
		d.mu.Unlock()
		if !hang {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func newFakeDB() *fakeDB { return &fakeDB{rows: map[int64]*driver.OutboxRecord{}} }

// insert adds records in order, returning their ids.
func (d *fakeDB) insert(recs ...driver.OutboxRecord) []int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []int64
	for _, r := range recs {
		d.nextID++
		r.ID = d.nextID
		d.rows[r.ID] = &r
		ids = append(ids, r.ID)
	}
	return ids
}

// insertAt adds a record with a given id, as a transaction that took a lower id and committed
// late would.
func (d *fakeDB) insertAt(id int64, r driver.OutboxRecord) {
	d.mu.Lock()
	defer d.mu.Unlock()
	r.ID = id
	d.rows[id] = &r
}

// setFailPurges makes purges fail, or succeed, from now on.
func (d *fakeDB) setFailPurges(fail bool) {
	d.mu.Lock()
	d.failPurges, d.failPurgesFromRun = fail, false
	d.mu.Unlock()
}

func (d *fakeDB) purgesFailing() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.failPurges
}

func (d *fakeDB) setDown(down bool) {
	d.mu.Lock()
	d.down = down
	d.mu.Unlock()
}

func (d *fakeDB) exists(id int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.rows[id] != nil
}

func (d *fakeDB) len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.rows)
}

func (d *fakeDB) markCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.marks
}

var errDBDown = errors.New("fake database down")

func (d *fakeDB) Mark(ctx context.Context, leaderID uuid.UUID, limit int) ([]driver.MarkedRecord, error) {
	return d.MarkExcept(ctx, leaderID, limit, nil)
}

func (d *fakeDB) MarkExcept(ctx context.Context, leaderID uuid.UUID, limit int, heldKeys []string) ([]driver.MarkedRecord, error) {
	return d.claim(ctx, limit, func(id int64, r *driver.OutboxRecord) bool {
		return (r.LeaderID == nil || *r.LeaderID != leaderID) && !slices.Contains(heldKeys, r.KafkaKey)
	}, func(r *driver.OutboxRecord) {
		l := leaderID
		r.LeaderID = &l
	})
}

// Read is the read strategy's query: what MarkExcept would return, changing nothing.
func (d *fakeDB) Read(ctx context.Context, limit int, heldKeys []string, exclude []int64) ([]driver.MarkedRecord, error) {
	return d.claim(ctx, limit, func(id int64, r *driver.OutboxRecord) bool {
		return !slices.Contains(exclude, id) && !slices.Contains(heldKeys, r.KafkaKey)
	}, func(*driver.OutboxRecord) {})
}

// claim returns up to limit of the oldest rows that pick, after taking a mark's time and failing
// as the test says; claimed changes each row returned (a mark's stamp), under the lock.
func (d *fakeDB) claim(ctx context.Context, limit int, pick func(int64, *driver.OutboxRecord) bool, claimed func(*driver.OutboxRecord)) ([]driver.MarkedRecord, error) {
	time.Sleep(d.markDelay)
	if err := d.wait(ctx); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.marks++
	if d.down {
		return nil, errDBDown
	}
	if d.failMk > 0 {
		d.failMk--
		return nil, errDBDown
	}
	var ids []int64
	for id, r := range d.rows {
		if pick(id, r) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var out []driver.MarkedRecord
	for _, id := range ids[:min(limit, len(ids))] {
		r := d.rows[id]
		claimed(r)
		out = append(out, driver.MarkedRecord{OutboxRecord: *r, Err: d.markErr[id]})
	}
	return out, nil
}

func (d *fakeDB) Purge(ctx context.Context, ids []int64) (int, error) {
	time.Sleep(d.purgeDelay) // a purge's latency, as a test sets it
	if err := d.wait(ctx); err != nil {
		return 0, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.failPurgesFromRun && !d.failPurges {
		keys := map[string]bool{}
		for _, id := range ids {
			if r := d.rows[id]; r != nil {
				d.failPurges = d.failPurges || keys[r.KafkaKey]
				keys[r.KafkaKey] = true
			}
		}
	}
	if d.down || d.failPurges {
		return 0, errDBDown
	}
	d.purges++
	n := 0
	for _, id := range ids {
		if d.rows[id] != nil {
			delete(d.rows, id)
			d.purged = append(d.purged, id)
			n++
		}
	}
	return n, nil
}

func (d *fakeDB) Reset(ctx context.Context, leaderID uuid.UUID, ids []int64) (int, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return 0, errDBDown
	}
	n := 0
	for _, id := range ids {
		if r := d.rows[id]; r != nil && r.LeaderID != nil && *r.LeaderID == leaderID {
			r.LeaderID = nil
			n++
		}
	}
	return n, nil
}

func (d *fakeDB) Dispose() {}

var (
	_ driver.Store  = (*fakeDB)(nil)
	_ driver.Reader = (*fakeDB)(nil)
)

// update changes a row as an operator would, giving it a new version.
func (d *fakeDB) update(id int64, change func(*driver.OutboxRecord)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if r := d.rows[id]; r != nil {
		change(r)
		if d.versions == nil {
			d.versions = map[int64]int{}
		}
		d.versions[id]++
	}
}

func (d *fakeDB) delete(id int64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.rows, id)
}

func (d *fakeDB) version(id int64) string { return fmt.Sprint(d.versions[id]) }

func (d *fakeDB) Reread(ctx context.Context, ids []int64) ([]driver.RereadRecord, error) {
	if err := d.wait(ctx); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rereads++
	if d.down {
		return nil, errDBDown
	}
	var out []driver.RereadRecord
	for _, id := range ids {
		if r := d.rows[id]; r != nil {
			out = append(out, driver.RereadRecord{MarkedRecord: driver.MarkedRecord{OutboxRecord: *r, Err: d.markErr[id]}, Version: d.version(id)})
		}
	}
	return out, nil
}

func (d *fakeDB) PurgeUnchanged(ctx context.Context, versions map[int64]string) ([]int64, error) {
	if err := d.wait(ctx); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return nil, errDBDown
	}
	var purged []int64
	for id, v := range versions {
		if d.rows[id] != nil && d.version(id) == v {
			delete(d.rows, id)
			d.purged = append(d.purged, id)
			purged = append(purged, id)
		}
	}
	return purged, nil
}

func (d *fakeDB) DeadLetter(ctx context.Context, id int64, version string, info driver.DeadLetterInfo) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return false, errDBDown
	}
	if d.rows[id] == nil || (version != "" && d.version(id) != version) {
		return false, nil
	}
	delete(d.rows, id)
	if d.deadLetters == nil {
		d.deadLetters = map[int64]driver.DeadLetterInfo{}
	}
	d.deadLetters[id] = info
	return true, nil
}

func (d *fakeDB) Ping(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down {
		return errDBDown
	}
	return nil
}

// published is one message as the fake broker stored it.
type published struct {
	id       int64
	topic    string
	key      string
	value    *string
	headers  outbox.Headers
	producer int
}

// fakeKafka is a broker and producer factory. Producers deliver asynchronously, after delay;
// messages land in the log when their transaction commits. It checks the harvester's promises
// as messages arrive.
type fakeKafka struct {
	t  *testing.T
	db *fakeDB

	mu           sync.Mutex
	delay        time.Duration
	log          []published
	failOnce     map[int64]error // fail the next delivery of these ids with this error
	rejectN      map[int64]int   // reject these ids this many times
	producers    int
	open         int // producers created and not closed
	epoch        int // the newest InitTransactions
	commits      int
	aborts       int
	fatalCommits int               // fail this many coming commits fatally
	abortCommits int               // fail this many coming commits abortably
	failNotes    int               // fail this many coming WriteNote calls abortably
	outstanding  map[string]outKey // key -> records sent and not yet committed or aborted
	lastAcked    map[string]int64  // key -> last id committed
	maxOut       int               // most records outstanding at once
	maxRun       int               // most records of one key in one committed transaction
	// note is the latest committed note, by place; rigNote is the rig's harvester's place.
	note map[driver.NotePlace]string
	// commitStalls makes this many coming calls to CommitTransaction time out, as librdkafka's
	// do on a slow coordinator: each waits out its context's deadline and returns a retriable
	// error, and the commit stays under way (an abort is refused meanwhile) until a call
	// completes it.
	commitStalls int
	// initHang makes InitTransactions wait out its context's deadline and time out.
	initHang bool
	// initErr, when set, is what InitTransactions returns.
	initErr error
	// produceFatal makes the next Produce report the producer's fatal error.
	produceFatal bool
	notes        int // committed transactions that wrote a note
	violations   []string
	// onProduce, if set, is called with each record produced, outside the lock.
	onProduce func(id int64)
	// onCommit, if set, is called as each commit begins, outside the lock.
	onCommit func()
}

// outKey is what one key has in flight: records of one producer's transaction.
type outKey struct {
	producer, txn int
	ids           []int64
}

func newFakeKafka(t *testing.T, db *fakeDB) *fakeKafka {
	return &fakeKafka{t: t, db: db, failOnce: map[int64]error{}, rejectN: map[int64]int{},
		outstanding: map[string]outKey{}, lastAcked: map[string]int64{}, note: map[driver.NotePlace]string{}}
}

func (k *fakeKafka) violate(format string, args ...any) {
	k.violations = append(k.violations, fmt.Sprintf(format, args...))
}

func (k *fakeKafka) provider(shard int) (driver.KafkaProducer, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.producers++
	k.open++
	if k.open > 1 {
		k.violate("producer %d created while an older one is still open", k.producers)
	}
	return &fakeProducer{k: k, index: k.producers, deliveries: make(chan driver.Delivery, 100_000)}, nil
}

type sentMessage struct {
	id      int64
	topic   string
	key     string
	value   *string
	headers outbox.Headers
	err     error
}

type fakeProducer struct {
	k          *fakeKafka
	index      int
	epoch      int
	deliveries chan driver.Delivery
	wg         sync.WaitGroup
	txn        []*sentMessage   // guarded by k.mu
	txnNo      int              // numbers the current transaction (guarded by k.mu)
	note       *string          // the current transaction's note, if it wrote one (guarded by k.mu)
	notePlace  driver.NotePlace // where it goes (guarded by k.mu)
	// abortable is set once a message of the current transaction has failed, committing while a
	// commit is under way; librdkafka refuses new messages in either state (guarded by k.mu).
	abortable, committing bool
	// fatal is set once the producer has reported a fatal error: like librdkafka's, it then fails
	// every transactional call and produce (guarded by k.mu).
	fatal bool
}

// errFatal is what a producer in librdkafka's fatal state returns.
var errFatal = &driver.TxnError{Err: errors.New("Local: Fatal error"), Fatal: true}

// errErroneousState is what librdkafka's produce returns while the transaction must be aborted
// or is being committed.
var errErroneousState = errors.New("Local: Erroneous state")

// waitOut blocks until ctx's deadline (the only part of a context librdkafka's transactional
// calls honour) and returns librdkafka's retriable timeout.
func waitOut(ctx context.Context) error {
	if deadline, ok := ctx.Deadline(); ok {
		time.Sleep(time.Until(deadline)) // librdkafka's call times out only at the deadline
	} else {
		panic("a transactional call without a deadline would wait forever in librdkafka")
	}
	return &driver.TxnError{Err: errors.New("Local: Timed out"), Retriable: true}
}

// endTxn forgets the current transaction (committed or not). Called with k.mu held.
func (p *fakeProducer) endTxn() {
	for _, m := range p.txn {
		delete(p.k.outstanding, m.key)
	}
	p.txn = nil
	p.note = nil
	p.txnNo++
	p.abortable, p.committing = false, false
}

func (p *fakeProducer) WriteNote(_ context.Context, place driver.NotePlace, note string) error {
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	if place.Group == "" || place.Topic == "" {
		p.k.violate("note written to %+v", place)
	}
	if p.k.failNotes > 0 {
		p.k.failNotes--
		return &driver.TxnError{Err: errors.New("offset commit failed"), Abortable: true}
	}
	p.note, p.notePlace = &note, place
	return nil
}

func (p *fakeProducer) ReadNote(_ context.Context, place driver.NotePlace) (string, error) {
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	return p.k.note[place], nil
}

func (p *fakeProducer) InitTransactions(ctx context.Context) error {
	p.k.mu.Lock()
	hang, err := p.k.initHang, p.k.initErr
	p.k.mu.Unlock()
	if hang {
		return waitOut(ctx)
	}
	if err != nil {
		return err
	}
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	p.k.epoch++
	p.epoch = p.k.epoch
	return nil
}

func (p *fakeProducer) BeginTransaction() error { return nil }

func (p *fakeProducer) CommitTransaction(ctx context.Context) error {
	p.wg.Wait() // a commit flushes: every message has been reported
	k := p.k
	k.mu.Lock()
	if p.fatal {
		k.mu.Unlock()
		return errFatal
	}
	if k.commitStalls > 0 {
		k.commitStalls--
		p.committing = true
		k.mu.Unlock()
		return waitOut(ctx)
	}
	onCommit := k.onCommit
	k.mu.Unlock()
	if onCommit != nil {
		onCommit()
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if p.epoch != k.epoch {
		return &driver.TxnError{Err: errors.New("producer fenced"), Fatal: true}
	}
	if k.abortCommits > 0 {
		k.abortCommits--
		return &driver.TxnError{Err: errors.New("coordinator trouble"), Abortable: true}
	}
	if k.fatalCommits > 0 {
		k.fatalCommits--
		p.endTxn()
		return &driver.TxnError{Err: errors.New("producer fenced by a newer epoch"), Fatal: true}
	}
	for _, m := range p.txn {
		if m.err != nil {
			return &driver.TxnError{Err: fmt.Errorf("a message failed: %w", m.err), Abortable: true}
		}
	}
	// Every record that a later one of its key follows in this transaction must be in the note,
	// so that a successor can purge it rather than publish the run again.
	var noted []int64
	if p.note != nil {
		records, err := epoch.DecodeNote(*p.note)
		if err != nil {
			k.violate("note %q: %v", *p.note, err)
		}
		for _, r := range records {
			noted = append(noted, r.ID)
		}
	}
	last := map[string]int64{}
	run := map[string]int{}
	for _, m := range p.txn {
		last[m.key] = m.id
		run[m.key]++
		k.maxRun = max(k.maxRun, run[m.key])
	}
	for _, m := range p.txn {
		if last[m.key] != m.id && !slices.Contains(noted, m.id) {
			k.violate("key %s: record %d committed in a run without a note listing it", m.key, m.id)
		}
	}
	for key := range last {
		if prev, ok := k.lastAcked[key]; ok && k.db.exists(prev) && !slices.ContainsFunc(p.txn, func(m *sentMessage) bool { return m.id == prev }) {
			k.violate("key %s: records committed before the purge of record %d committed", key, prev)
		}
	}
	for _, m := range p.txn {
		k.log = append(k.log, published{id: m.id, topic: m.topic, key: m.key, value: m.value, headers: m.headers, producer: p.index})
		k.lastAcked[m.key] = m.id
	}
	if p.note != nil {
		k.note[p.notePlace] = *p.note
		k.notes++
	}
	k.commits++
	p.endTxn()
	return nil
}

func (p *fakeProducer) AbortTransaction(context.Context) error {
	p.wg.Wait()
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	if p.fatal {
		return errFatal
	}
	if p.committing {
		return &driver.TxnError{Err: errors.New("Conflicting commit_transaction API call is already in progress"), Retriable: true}
	}
	p.endTxn()
	p.k.aborts++
	return nil
}

func (p *fakeProducer) Produce(msg driver.Message) error {
	k := p.k
	id, key := recordID(msg), string(msg.Key)
	k.mu.Lock()
	if k.produceFatal {
		k.produceFatal = false
		p.fatal = true
	}
	if p.fatal {
		k.mu.Unlock()
		return errFatal
	}
	if err := outbox.CheckName(msg.Topic); err != nil {
		k.mu.Unlock()
		return &driver.RejectedError{Err: err, ByGoharvest: true}
	}
	if p.abortable || p.committing {
		k.mu.Unlock()
		return &driver.TxnError{Err: errErroneousState, Retriable: true}
	}
	out, ok := k.outstanding[key]
	if ok && (out.producer != p.index || out.txn != p.txnNo) {
		k.violate("key %s: record %d sent while records %v of another transaction are still in flight", key, id, out.ids)
	}
	// The previous record of this key, once committed, must be purged before the next run starts.
	if prev, acked := k.lastAcked[key]; !ok && acked && prev != id && k.db.exists(prev) {
		k.violate("key %s: record %d sent before the purge of record %d committed", key, id, prev)
	}
	k.outstanding[key] = outKey{producer: p.index, txn: p.txnNo, ids: append(out.ids, id)}
	n := 0
	for _, o := range k.outstanding {
		n += len(o.ids)
	}
	k.maxOut = max(k.maxOut, n)
	m := &sentMessage{id: id, topic: msg.Topic, key: key, value: valueOf(msg), headers: msg.Headers}
	if k.rejectN[id] > 0 {
		k.rejectN[id]--
		m.err = &driver.RejectedError{Err: errors.New("message too large")}
	} else if e, ok := k.failOnce[id]; ok {
		delete(k.failOnce, id)
		m.err = e
	}
	p.txn = append(p.txn, m)
	// The failed request puts the transaction in librdkafka's abortable state at once; its
	// delivery report follows.
	p.abortable = p.abortable || m.err != nil
	delay := k.delay
	onProduce := k.onProduce
	k.mu.Unlock()
	if onProduce != nil {
		onProduce(id)
	}

	p.wg.Go(func() {
		time.Sleep(delay) // the broker's latency, as a test sets it
		p.deliveries <- driver.Delivery{Opaque: msg.Opaque, Err: m.err}
	})
	return nil
}

func (p *fakeProducer) Deliveries() <-chan driver.Delivery { return p.deliveries }
func (p *fakeProducer) Abandon()                           {}
func (p *fakeProducer) Close() {
	p.wg.Wait()
	p.k.mu.Lock()
	// A transaction left open is aborted: the broker does so when the next producer with the
	// transactional ID calls InitTransactions, and the next producer is created only after this one
	// is closed.
	p.endTxn()
	p.k.open--
	p.k.mu.Unlock()
	close(p.deliveries)
}

// stats returns what the broker counted, under its lock.
func (k *fakeKafka) stats() (commits, notes, maxRun int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.commits, k.notes, k.maxRun
}

func (k *fakeKafka) published() []published {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.log)
}

// checkOrder verifies that every id in want was published and that, per key, ids never go
// backwards except for an immediate repeat.
func (k *fakeKafka) checkOrder(t *testing.T, want []int64, keyOf func(int64) string, orderOf func(int64) int64) {
	t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, v := range k.violations {
		t.Error(v)
	}
	seen := map[int64]bool{}
	last := map[string]int64{}
	for _, m := range k.log {
		seen[m.id] = true
		o := orderOf(m.id)
		if prev, ok := last[m.key]; ok && o < prev {
			t.Errorf("key %s went backwards: %d after %d", m.key, o, prev)
		}
		last[m.key] = o
	}
	for _, id := range want {
		if !seen[id] {
			t.Errorf("record %d (key %s) was never published", id, keyOf(id))
		}
	}
}

// recordID returns the id of the record a message publishes. The engine's opaque value says it
// (a flight has RecordID); any other message, as the producer contract's, counts as record 0.
func recordID(msg driver.Message) int64 {
	if r, ok := msg.Opaque.(interface{ RecordID() int64 }); ok {
		return r.RecordID()
	}
	return 0
}

// valueOf returns a message's value as an outbox record holds it: nil for a tombstone.
func valueOf(msg driver.Message) *string {
	if msg.Value == nil {
		return nil
	}
	v := string(msg.Value)
	return &v
}

// String returns a pointer to s, for OutboxRecord.KafkaValue.
func String(s string) *string { return &s }

// electionState is where the fake election stands, as neli's states would say.
type electionState int

const (
	stateFollower electionState = iota
	stateLeader
	stateFenced
)

// fakeElector is leader election under the test's control.
type fakeElector struct {
	mu            sync.Mutex
	state         electionState
	barrier       func([]int32)
	revokePending bool
	pulses        int
	closed        bool
}

// revoke takes leadership away as neli does: the state turns to follower and the next Pulse runs
// the barrier before it returns.
func (e *fakeElector) revoke() {
	e.mu.Lock()
	e.state = stateFollower
	e.revokePending = true
	e.mu.Unlock()
}

func (e *fakeElector) provider(barrier func([]int32)) (driver.Elector, error) {
	e.barrier = barrier
	return e, nil
}

func (e *fakeElector) Leading() bool { return e.State() == stateLeader }
func (e *fakeElector) Fenced() bool  { return e.State() == stateFenced }

func (e *fakeElector) Pulse(ctx context.Context) (bool, error) {
	e.mu.Lock()
	e.pulses++
	revoke := e.revokePending
	e.revokePending = false
	e.mu.Unlock()
	if revoke {
		e.barrier([]int32{0})
	}
	return e.State() == stateLeader, nil
}

// Partitions: the fake leads the one shard while it is the leader.
func (e *fakeElector) Partitions() []int32 {
	if e.State() == stateLeader {
		return []int32{0}
	}
	return nil
}

func (e *fakeElector) State() electionState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state
}

func (e *fakeElector) set(s electionState) {
	e.mu.Lock()
	e.state = s
	e.mu.Unlock()
}

func (e *fakeElector) Close(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	e.state = stateFollower
	return nil
}

// eventLog collects events for assertions.
type eventLog struct {
	mu     sync.Mutex
	events []event.Event
}

func (l *eventLog) handle(e event.Event) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog) all() []event.Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

func countEvents[T event.Event](l *eventLog) int {
	n := 0
	for _, e := range l.all() {
		if _, ok := e.(T); ok {
			n++
		}
	}
	return n
}
