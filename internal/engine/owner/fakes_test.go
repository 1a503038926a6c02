package owner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/memory"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/epoch"
	"github.com/goharvest/goharvest/outbox"
)

// fakeDB is the in-memory outbox (memory.Store) with the faults the engine's tests inject.
type fakeDB struct {
	*memory.Store
	mu   sync.Mutex
	down bool // every call fails while set
	// failPurges makes purges fail while set, as if the leader stopped after a commit and
	// before its purge.
	failPurges bool
	// failPurgesFromRun sets failPurges at the first purge of two records of one key: a run its
	// transaction's note lists.
	failPurgesFromRun bool
	marks             int
	purges            int
	failMk            int // fail this many coming marks
	// purgeDelay is the time a purge takes, as a round trip to a real database would.
	purgeDelay time.Duration
	// markDelay is the time a mark takes.
	markDelay time.Duration
	// hang makes every call block until its context ends, as on a locked table.
	hang bool
	// hung counts the calls that have met a hang, for tests that wait for one to be stuck.
	hung int
}

func newFakeDB() *fakeDB { return &fakeDB{Store: memory.NewStore()} }

func (d *fakeDB) setHang(hang bool) {
	d.mu.Lock()
	d.hang = hang
	d.mu.Unlock()
}

// fault waits while the database hangs, as a statement waits for a lock, until ctx ends; then
// it fails while the database is down.
func (d *fakeDB) fault(ctx context.Context) error {
	for counted := false; ; counted = true {
		d.mu.Lock()
		hang, down := d.hang, d.down
		if hang && !counted {
			d.hung++
		}
		d.mu.Unlock()
		if !hang {
			if down {
				return errDBDown
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// insert adds records in order, returning their ids.
func (d *fakeDB) insert(recs ...driver.OutboxRecord) []int64 { return d.Insert(recs...) }

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

func (d *fakeDB) exists(id int64) bool { return d.Exists(id) }
func (d *fakeDB) len() int             { return d.Len() }

func (d *fakeDB) markCount() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.marks
}

var errDBDown = errors.New("fake database down")

// claimFault takes a mark's time and fails as the test says.
func (d *fakeDB) claimFault(ctx context.Context) error {
	d.mu.Lock()
	delay := d.markDelay
	d.mu.Unlock()
	time.Sleep(delay)
	if err := d.fault(ctx); err != nil {
		d.mu.Lock()
		d.marks++
		d.mu.Unlock()
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.marks++
	if d.failMk > 0 {
		d.failMk--
		return errDBDown
	}
	return nil
}

func (d *fakeDB) Mark(ctx context.Context, leaderID uuid.UUID, limit int) ([]driver.MarkedRecord, error) {
	return d.MarkExcept(ctx, leaderID, limit, nil)
}

func (d *fakeDB) MarkExcept(ctx context.Context, leaderID uuid.UUID, limit int, heldKeys []string) ([]driver.MarkedRecord, error) {
	if err := d.claimFault(ctx); err != nil {
		return nil, err
	}
	return d.Store.MarkExcept(ctx, leaderID, limit, heldKeys)
}

func (d *fakeDB) Read(ctx context.Context, limit int, heldKeys []string, exclude []int64) ([]driver.MarkedRecord, error) {
	if err := d.claimFault(ctx); err != nil {
		return nil, err
	}
	return d.Store.Read(ctx, limit, heldKeys, exclude)
}

func (d *fakeDB) Purge(ctx context.Context, ids []int64) (int, error) {
	d.mu.Lock()
	delay := d.purgeDelay
	d.mu.Unlock()
	time.Sleep(delay) // a purge's latency, as a test sets it
	if err := d.fault(ctx); err != nil {
		return 0, err
	}
	d.mu.Lock()
	if d.failPurgesFromRun && !d.failPurges {
		keys := map[string]bool{}
		for _, id := range ids {
			if r, ok := d.Row(id); ok {
				d.failPurges = d.failPurges || keys[r.KafkaKey]
				keys[r.KafkaKey] = true
			}
		}
	}
	if d.failPurges {
		d.mu.Unlock()
		return 0, errDBDown
	}
	d.purges++
	d.mu.Unlock()
	return d.Store.Purge(ctx, ids)
}

func (d *fakeDB) Reset(ctx context.Context, leaderID uuid.UUID, ids []int64) (int, error) {
	d.mu.Lock()
	down := d.down
	d.mu.Unlock()
	if down {
		return 0, errDBDown
	}
	return d.Store.Reset(ctx, leaderID, ids)
}

func (d *fakeDB) Reread(ctx context.Context, ids []int64) ([]driver.RereadRecord, error) {
	if err := d.fault(ctx); err != nil {
		return nil, err
	}
	return d.Store.Reread(ctx, ids)
}

func (d *fakeDB) PurgeUnchanged(ctx context.Context, versions map[int64]string) ([]int64, error) {
	if err := d.fault(ctx); err != nil {
		return nil, err
	}
	return d.Store.PurgeUnchanged(ctx, versions)
}

func (d *fakeDB) DeadLetter(ctx context.Context, id int64, version string, info driver.DeadLetterInfo) (bool, error) {
	d.mu.Lock()
	down := d.down
	d.mu.Unlock()
	if down {
		return false, errDBDown
	}
	return d.Store.DeadLetter(ctx, id, version, info)
}

func (d *fakeDB) Ping(ctx context.Context) error {
	d.mu.Lock()
	down := d.down
	d.mu.Unlock()
	if down {
		return errDBDown
	}
	return d.Store.Ping(ctx)
}

var (
	_ driver.Store  = (*fakeDB)(nil)
	_ driver.Reader = (*fakeDB)(nil)
)

// update changes a row as an operator would, giving it a new version.
func (d *fakeDB) update(id int64, change func(*driver.OutboxRecord)) { d.Update(id, change) }

// published is one message as the fake broker stored it.
type published struct {
	id       int64
	topic    string
	key      string
	value    *string
	headers  outbox.Headers
	producer int
}

// fakeKafka is the in-memory broker (memory.Broker) with the faults the engine's tests inject,
// and a check of the harvester's promises as messages arrive: a key's records are in one
// transaction at a time, a run of a key is noted, and a record's successor is sent only once its
// purge committed.
type fakeKafka struct {
	t      *testing.T
	db     *fakeDB
	broker *memory.Broker

	mu           sync.Mutex
	delay        time.Duration   // the broker's latency, applied at each Produce
	failOnce     map[int64]error // fail the next delivery of these ids with this error
	rejectN      map[int64]int   // reject these ids this many times
	producers    int
	open         int // producers created and not closed
	commits      int
	aborts       int
	fatalCommits int               // fail this many coming commits fatally
	abortCommits int               // fail this many coming commits abortably
	failNotes    int               // fail this many coming WriteNote calls abortably
	outstanding  map[string]outKey // key -> records sent and not yet committed or aborted
	lastAcked    map[string]int64  // key -> last id committed
	maxOut       int               // most records outstanding at once
	maxRun       int               // most records of one key in one committed transaction
	// commitStalls makes this many coming calls to CommitTransaction time out, as librdkafka's
	// do on a slow coordinator: each waits out its context's deadline and returns a retriable
	// error, and the commit stays under way (an abort is refused meanwhile) until a call
	// completes it.
	commitStalls int
	// initHang makes InitTransactions wait out its context's deadline and time out.
	initHang bool
	// initHung counts the InitTransactions calls that have met initHang.
	initHung int
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
	k := &fakeKafka{t: t, db: db, broker: memory.NewBroker(), failOnce: map[int64]error{}, rejectN: map[int64]int{},
		outstanding: map[string]outKey{}, lastAcked: map[string]int64{}}
	k.broker.SetRefuse(k.refuse)
	return k
}

// refuse is the broker's hook: the deliveries a test fails.
func (k *fakeKafka) refuse(msg driver.Message) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	id := recordID(msg)
	if k.rejectN[id] > 0 {
		k.rejectN[id]--
		return &driver.RejectedError{Err: errors.New("message too large")}
	}
	if e, ok := k.failOnce[id]; ok {
		delete(k.failOnce, id)
		return e
	}
	return nil
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
	return &fakeProducer{Producer: k.broker.NewProducer(fmt.Sprintf("goharvest.g.%d", shard)), k: k, index: k.producers}, nil
}

type sentMessage struct {
	id  int64
	key string
}

// fakeProducer is a memory.Producer with the faults of fakeKafka.
type fakeProducer struct {
	*memory.Producer
	k     *fakeKafka
	index int
	txn   []sentMessage // guarded by k.mu
	txnNo int           // numbers the current transaction (guarded by k.mu)
	note  *string       // the current transaction's note, if it wrote one (guarded by k.mu)
	// committing is set while a commit that timed out is under way; librdkafka refuses new
	// messages and aborts meanwhile (guarded by k.mu).
	committing bool
	// fatal is set once the producer has reported a fatal error: like librdkafka's, it then fails
	// every transactional call and produce (guarded by k.mu).
	fatal  bool
	closed bool // guarded by k.mu
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
	p.committing = false
}

func (p *fakeProducer) WriteNote(ctx context.Context, place driver.NotePlace, note string) error {
	p.k.mu.Lock()
	if place.Group == "" || place.Topic == "" {
		p.k.violate("note written to %+v", place)
	}
	if p.fatal {
		p.k.mu.Unlock()
		return errFatal
	}
	if p.k.failNotes > 0 {
		p.k.failNotes--
		p.k.mu.Unlock()
		return &driver.TxnError{Err: errors.New("offset commit failed"), Abortable: true}
	}
	p.note = &note
	p.k.mu.Unlock()
	return p.Producer.WriteNote(ctx, place, note)
}

func (p *fakeProducer) InitTransactions(ctx context.Context) error {
	p.k.mu.Lock()
	hang, err := p.k.initHang, p.k.initErr
	if hang {
		p.k.initHung++
	}
	p.k.mu.Unlock()
	if hang {
		return waitOut(ctx)
	}
	if err != nil {
		return err
	}
	return p.Producer.InitTransactions(ctx)
}

func (p *fakeProducer) CommitTransaction(ctx context.Context) error {
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
	if k.abortCommits > 0 {
		k.abortCommits--
		k.mu.Unlock()
		return &driver.TxnError{Err: errors.New("coordinator trouble"), Abortable: true}
	}
	if k.fatalCommits > 0 {
		k.fatalCommits--
		p.endTxn()
		k.mu.Unlock()
		p.Producer.AbortTransaction(ctx) // never committed
		return &driver.TxnError{Err: errors.New("producer fenced by a newer epoch"), Fatal: true}
	}
	k.mu.Unlock()
	if err := p.Producer.CommitTransaction(ctx); err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
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
		k.notes++
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
		if prev, ok := k.lastAcked[key]; ok && k.db.exists(prev) && !slices.ContainsFunc(p.txn, func(m sentMessage) bool { return m.id == prev }) {
			k.violate("key %s: records committed before the purge of record %d committed", key, prev)
		}
	}
	for _, m := range p.txn {
		k.lastAcked[m.key] = m.id
	}
	k.commits++
	p.endTxn()
	return nil
}

func (p *fakeProducer) AbortTransaction(ctx context.Context) error {
	p.k.mu.Lock()
	if p.fatal {
		p.k.mu.Unlock()
		return errFatal
	}
	if p.committing {
		p.k.mu.Unlock()
		return &driver.TxnError{Err: errors.New("Conflicting commit_transaction API call is already in progress"), Retriable: true}
	}
	p.k.mu.Unlock()
	if err := p.Producer.AbortTransaction(ctx); err != nil {
		return err
	}
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
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
	if p.committing {
		k.mu.Unlock()
		return &driver.TxnError{Err: errErroneousState, Retriable: true}
	}
	delay := k.delay
	k.mu.Unlock()
	k.broker.SetLatency(delay) // outside k.mu: the broker calls refuse, which takes k.mu, under its lock
	if err := p.Producer.Produce(msg); err != nil {
		return err
	}
	k.mu.Lock()
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
	p.txn = append(p.txn, sentMessage{id: id, key: key})
	onProduce := k.onProduce
	k.mu.Unlock()
	if onProduce != nil {
		onProduce(id)
	}
	return nil
}

func (p *fakeProducer) Close() {
	p.Producer.Close()
	p.k.mu.Lock()
	defer p.k.mu.Unlock()
	// A transaction left open is aborted: the broker does so when the next producer with the
	// transactional ID calls InitTransactions, and the next producer is created only after this one
	// is closed.
	p.endTxn()
	if !p.closed {
		p.closed = true
		p.k.open--
	}
}

// stats returns what the broker counted, under its lock.
func (k *fakeKafka) stats() (commits, notes, maxRun int) {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.commits, k.notes, k.maxRun
}

func (k *fakeKafka) published() []published {
	var out []published
	for _, m := range k.broker.Committed() {
		var value *string
		if m.Value != nil {
			value = String(string(m.Value))
		}
		out = append(out, published{id: recordID(driver.Message{Opaque: m.Opaque}), topic: m.Topic, key: string(m.Key),
			value: value, headers: m.Headers, producer: m.Producer})
	}
	return out
}

// checkOrder verifies that every id in want was published and that, per key, ids never go
// backwards except for an immediate repeat.
func (k *fakeKafka) checkOrder(t *testing.T, want []int64, keyOf func(int64) string, orderOf func(int64) int64) {
	t.Helper()
	log := k.published()
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, v := range k.violations {
		t.Error(v)
	}
	seen := map[int64]bool{}
	last := map[string]int64{}
	for _, m := range log {
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
// (a flight has RecordID); any other message counts as record 0.
func recordID(msg driver.Message) int64 {
	if r, ok := msg.Opaque.(interface{ RecordID() int64 }); ok {
		return r.RecordID()
	}
	return 0
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

// fakeElector is the in-memory election (memory.Election) under the test's control: each
// harvester joins it anew, and the test moves the latest contender between neli's states.
type fakeElector struct {
	election *memory.Election
	mu       sync.Mutex
	current  *memory.Elector
	revoked  <-chan struct{} // of the last revoke; nil before one
	// rest, when set before the harvester starts, makes the contender a driver.RestingElector
	// that asks for that rest, and whose wake every change of state signals.
	rest time.Duration
	wake chan struct{}
	// pulseTakes, when set with rest, is how long each of the resting contender's Pulses takes.
	pulseTakes time.Duration
}

// restingElector is a contender that can rest (driver.RestingElector).
type restingElector struct {
	*memory.Elector
	wake       <-chan struct{}
	rest       time.Duration
	pulseTakes time.Duration
}

func (e *restingElector) Wake() <-chan struct{} { return e.wake }
func (e *restingElector) Rest() time.Duration   { return e.rest }

func (e *restingElector) Pulse(ctx context.Context) (bool, error) {
	leading, err := e.Elector.Pulse(ctx)
	time.Sleep(e.pulseTakes) // a Pulse that waits on the group a while, as a real one may
	return leading, err
}

func newFakeElector() *fakeElector { return &fakeElector{election: memory.NewElection(1)} }

func (e *fakeElector) provider(barrier func([]int32)) (driver.Elector, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.current = e.election.Join(barrier)
	if e.rest > 0 {
		e.wake = make(chan struct{}, 1)
		return &restingElector{Elector: e.current, wake: e.wake, rest: e.rest, pulseTakes: e.pulseTakes}, nil
	}
	return e.current, nil
}

// poke signals a resting contender's wake, as a change of its state does.
func (e *fakeElector) poke() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.wake != nil {
		select {
		case e.wake <- struct{}{}:
		default:
		}
	}
}

func (e *fakeElector) elector() *memory.Elector {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.current
}

// revoke takes leadership away as neli does: the harvester stops leading and the next Pulse runs
// the barrier before it returns (revokeDone then reports it has).
func (e *fakeElector) revoke() {
	done := e.elector().Revoke()
	e.mu.Lock()
	e.revoked = done
	e.mu.Unlock()
	e.poke()
}

// revokeDone reports whether the last revoke's barrier has returned.
func (e *fakeElector) revokeDone() bool {
	e.mu.Lock()
	done := e.revoked
	e.mu.Unlock()
	select {
	case <-done:
		return true
	default:
		return done == nil
	}
}

// set moves the contender to a state: the leader from its next Pulse, a follower (as Revoke), or
// fenced.
func (e *fakeElector) set(s electionState) {
	switch c := e.elector(); s {
	case stateLeader:
		c.Elect()
	case stateFenced:
		c.Fence()
	default:
		e.revoke()
	}
	e.poke()
}

func (e *fakeElector) pulses() int  { return e.elector().Pulses() }
func (e *fakeElector) closed() bool { return e.elector().Closed() }

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
