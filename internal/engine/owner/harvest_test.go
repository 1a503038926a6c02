package owner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/epoch"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// claimStrategy is how the rig's harvesters claim rows: by reading unless GOHARVEST_TEST_CLAIM
// says "mark". make test runs this package's tests with each, so that both strategies are held
// to every test of the engine.
var claimStrategy = func() Claim {
	if os.Getenv("GOHARVEST_TEST_CLAIM") == "mark" {
		return ClaimByMarking
	}
	return ClaimByReading
}()

// rigNotes is where the rig's harvester leaves its notes.
var rigNotes = driver.NotePlace{Group: "g.notes", Topic: "t"}

// rig wires a harvester to fakes.
type rig struct {
	t        *testing.T
	db       *fakeDB
	kafka    *fakeKafka
	elector  *fakeElector
	events   *eventLog
	logs     *syncbuf.Buffer
	h        *Owner
	keyOf    map[int64]string
	registry *prometheus.Registry
	seqOf    map[int64]int64 // per-key sequence, the order records must be published in
	nextSeq  map[string]int64
	// store, when set before start, is what the harvester opens instead of db (a wrapper of it).
	store driver.DatabaseBinding
}

// fastLimits lets keys run (MaxKeyRun), so that every test exercises runs and their notes.
func fastLimits() epoch.Limits {
	return epoch.Limits{
		MaxKeyRun:        100,
		HeartbeatTimeout: time.Second,
		MinPollInterval:  10 * time.Millisecond,
		IOErrorBackoff:   20 * time.Millisecond,
		MarkBackoff:      time.Millisecond,
		MaxMarkBackoff:   20 * time.Millisecond,
	}
}

func newRig(t *testing.T, limits epoch.Limits) *rig {
	r := &rig{t: t, db: newFakeDB(), elector: newFakeElector(), events: &eventLog{},
		logs: &syncbuf.Buffer{}, keyOf: map[int64]string{}, seqOf: map[int64]int64{}, nextSeq: map[string]int64{},
		registry: prometheus.NewRegistry()}
	r.kafka = newFakeKafka(t, r.db)
	r.h = r.newHarvest(limits)
	return r
}

func (r *rig) newHarvest(limits epoch.Limits) *Owner {
	h := New(Config{
		Name:            "test",
		Shards:          1,
		Limits:          limits.WithDefaults(),
		Logger:          slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Registerer:      r.registry,
		Claim:           claimStrategy,
		NoteGroup:       rigNotes.Group,
		LeaderTopic:     rigNotes.Topic,
		TransactionalID: "goharvest.g",
		OpenStore: func() (driver.DatabaseBinding, error) {
			if r.store != nil {
				return r.store, nil
			}
			return r.db, nil
		},
		NewElector:  r.elector.provider,
		NewProducer: r.kafka.provider,
	})
	h.SetEventHandler(r.events.handle)
	return h
}

// load writes perKey records for each of keys keys, interleaved as concurrent writers would.
func (r *rig) load(keys, perKey int) []int64 {
	var recs []driver.OutboxRecord
	for i := range perKey {
		for k := range keys {
			recs = append(recs, driver.OutboxRecord{KafkaTopic: "t", KafkaKey: fmt.Sprintf("k%d", k), KafkaValue: String(fmt.Sprint(i))})
		}
	}
	return r.add(recs...)
}

func (r *rig) add(recs ...driver.OutboxRecord) []int64 {
	ids := r.db.insert(recs...)
	for i, id := range ids {
		r.note(id, recs[i].KafkaKey)
	}
	return ids
}

func (r *rig) note(id int64, key string) {
	r.keyOf[id] = key
	r.seqOf[id] = r.nextSeq[key]
	r.nextSeq[key]++
}

func (r *rig) start() {
	r.t.Helper()
	if err := r.h.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { r.h.Stop(); r.h.Await() })
}

func (r *rig) waitFor(what string, within time.Duration, cond func() bool) {
	r.t.Helper()
	// Every 2ms: the fakes move in milliseconds, and some tests must act (Stop, a fault) while a
	// run is still under way.
	if !testwait.UntilEvery(within, 2*time.Millisecond, cond) {
		r.t.Fatalf("timed out after %v waiting for %s", within, what)
	}
}

// runUntilEmpty starts the harvester, waits for the outbox to empty and stops it.
func (r *rig) runUntilEmpty() {
	r.t.Helper()
	r.start()
	r.waitEmpty(20 * time.Second)
	r.stop()
}

func (r *rig) waitEmpty(within time.Duration) {
	r.t.Helper()
	r.waitFor("an empty outbox", within, func() bool { return r.db.len() == 0 })
}

func (r *rig) checkOrder(want []int64) {
	r.t.Helper()
	r.kafka.checkOrder(r.t, want, func(id int64) string { return r.keyOf[id] }, func(id int64) int64 { return r.seqOf[id] })
}

func (r *rig) stop() {
	r.t.Helper()
	r.h.Stop()
	done := make(chan error, 1)
	go func() { done <- r.h.Await() }()
	select {
	case err := <-done:
		if err != nil {
			r.t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		r.t.Fatal("Stop did not complete within 10s")
	}
}

func TestDrainsEverythingInPerKeyOrder(t *testing.T) {
	limits := fastLimits()
	limits.MinMetricsInterval = time.Millisecond
	r := newRig(t, limits)
	r.kafka.delay = time.Millisecond
	r.db.purgeDelay = 2 * time.Millisecond
	ids := r.load(50, 40)
	r.runUntilEmpty()
	r.checkOrder(ids)
	// Purges are group-committed: one statement carries many records.
	if r.db.purges*4 > len(ids) {
		t.Errorf("%d purge statements for %d records; they are not batched", r.db.purges, len(ids))
	}
	var last event.MeterRead
	for _, e := range r.events.all() {
		if m, ok := e.(event.MeterRead); ok {
			if m.Stats.Total < last.Stats.Total {
				t.Errorf("meter total went down: %v after %v", m.Stats, last.Stats)
			}
			last = m
		}
	}
	if last.Stats.Total == 0 || last.Stats.Total > int64(len(ids)) {
		t.Errorf("last meter reading %v; want a total between 1 and %d", last.Stats, len(ids))
	}
	if got := len(r.kafka.published()); got != len(ids) {
		t.Errorf("published %d messages for %d records without any fault", got, len(ids))
	}
	if n := countEvents[event.LeaderAcquired](r.events); n != 1 {
		t.Errorf("%d LeaderAcquired events, want 1", n)
	}
	if r.h.State() != Stopped {
		t.Errorf("state %v after Await, want stopped", r.h.State())
	}
}

// One hot key. A transaction carries a run of its records, never more than MaxKeyRun, and notes
// every record of the run but the last (the fake producer flags a run without its note, and any
// record sent while another transaction's are in flight or before their purge). With MaxKeyRun
// 1, each record waits for its predecessor's purge and no note is written.
func TestKeyRuns(t *testing.T) {
	for _, run := range []int{1, 100} {
		t.Run(fmt.Sprint("MaxKeyRun=", run), func(t *testing.T) {
			limits := fastLimits()
			limits.MaxKeyRun = run
			r := newRig(t, limits)
			ids := r.load(1, 300)
			r.runUntilEmpty()
			r.checkOrder(ids)
			commits, notes, maxRun := r.kafka.stats()
			if maxRun > run {
				t.Errorf("a transaction carried %d records of the key; MaxKeyRun is %d", maxRun, run)
			}
			if run == 1 && notes > 0 {
				t.Errorf("%d notes written without runs", notes)
			}
			if run > 1 && (maxRun < 2 || notes == 0) {
				t.Errorf("longest run %d, %d notes: the key did not run", maxRun, notes)
			}
			t.Logf("%d records in %d transactions, longest run %d", len(ids), commits, maxRun)
		})
	}
}

// The leader stops after a run committed and before its purge did. The next epoch purges the
// records the note lists and publishes again only the last of each run: a consumer sees an
// immediate repeat, never a key going backwards.
func TestNextEpochPurgesNotedRecords(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		r := newRig(t, fastLimits())
		ids := r.load(3, 100)
		r.db.failPurgesFromRun = true
		r.start()
		r.waitFor("a run to commit and its purge to fail", 10*time.Second, r.db.purgesFailing)
		r.stop()
		firstEpoch := len(r.kafka.published())

		r.db.setFailPurges(false)
		r.elector.set(stateLeader)
		r.h = r.newHarvest(fastLimits())
		r.runUntilEmpty()
		r.checkOrder(ids)
		// Each key had at most one run committed and unpurged; only its last record may come again.
		if dups := len(r.kafka.published()) - len(ids); dups > 3 {
			t.Errorf("%d records published again after %d were committed; want at most one per key (3)", dups, firstEpoch)
		}
		if !strings.Contains(r.logs.String(), "purged records an earlier leader published") {
			t.Error("the next epoch did not report purging the noted records")
		}
	})
}

// The leader stops after a run committed and before its purge did, and the database fails over
// to a standby that lacked the run's rows: it hands their ids out again, to new rows. The next
// epoch purges only the noted rows that are still what was published (their fingerprints match),
// so the new rows are published, not deleted unseen.
func TestNextEpochLeavesNotedIDsThatNameOtherRows(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		r := newRig(t, fastLimits())
		r.load(3, 100)
		r.db.failPurgesFromRun = true
		r.start()
		r.waitFor("a run to commit and its purge to fail", 10*time.Second, r.db.purgesFailing)
		r.stop()
		var reused []int64
		for _, p := range r.kafka.published() {
			if r.db.exists(p.id) && !slices.Contains(reused, p.id) {
				reused = append(reused, p.id)
				r.db.update(p.id, func(rec *driver.OutboxRecord) { rec.KafkaKey, rec.KafkaValue = "new", String("new row") })
			}
		}
		if len(reused) == 0 {
			t.Fatal("no published record was left unpurged; the test exercised nothing")
		}

		r.db.setFailPurges(false)
		r.elector.set(stateLeader)
		r.h = r.newHarvest(fastLimits())
		r.runUntilEmpty()
		values := r.publishedValues()
		for _, id := range reused {
			if !slices.Contains(values, fmt.Sprintf("%d:new row", id)) {
				t.Errorf("the new row that took id %d was never published", id)
			}
		}
	})
}

// A note that cannot be written fails its transaction like a failed commit: it is aborted and
// its runs are sent again, from their first records, in the next.
func TestFailedNoteAbortsTheTransaction(t *testing.T) {
	r := newRig(t, fastLimits())
	ids := r.load(5, 100)
	r.kafka.failNotes = 2
	r.runUntilEmpty()
	r.checkOrder(ids)
	if r.kafka.aborts < 2 {
		t.Errorf("%d aborts for two failed notes", r.kafka.aborts)
	}
	if n := countEvents[event.LeaderRefreshed](r.events); n != 0 {
		t.Errorf("%d remarks for failures a retry in place handles", n)
	}
}

// A failed delivery aborts the transaction; its records are sent again in the next one (their
// keys still held), without a remark.
func TestDeliveryFailureRetriesInTheNextTransaction(t *testing.T) {
	r := newRig(t, fastLimits())
	r.kafka.delay = time.Millisecond
	ids := r.load(20, 20)
	r.kafka.failOnce[ids[100]] = errors.New("request timed out")
	r.kafka.failOnce[ids[250]] = errors.New("broker went away")
	r.runUntilEmpty()
	r.checkOrder(ids)
	if r.kafka.aborts < 1 {
		t.Fatalf("no aborted transaction for two failed deliveries")
	}
	if n := countEvents[event.LeaderRefreshed](r.events); n != 0 {
		t.Fatalf("%d remarks for failures a retry in place handles", n)
	}
}

// A producer whose transactions keep failing is replaced: after a few failed commits in a row
// the epoch ends and a new one, with a new producer, carries on.
func TestRepeatedTransactionFailuresRemark(t *testing.T) {
	r := newRig(t, fastLimits())
	r.kafka.delay = time.Millisecond
	ids := r.load(20, 20)
	r.kafka.abortCommits = 7
	r.runUntilEmpty()
	r.checkOrder(ids)
	if n := countEvents[event.LeaderRefreshed](r.events); n < 1 {
		t.Fatalf("no remark after %d failed commits in a row", 7)
	}
	if r.kafka.producers < 3 {
		t.Fatalf("%d producers: failing transactions did not bring a new one", r.kafka.producers)
	}
}

// A fatal producer error (a newer epoch fenced this producer, say) ends the epoch: the records
// are reset and marked again under a new leader ID, with a new producer.
func TestFatalTransactionErrorRemarks(t *testing.T) {
	r := newRig(t, fastLimits())
	r.kafka.delay = time.Millisecond
	ids := r.load(20, 20)
	r.kafka.fatalCommits = 2
	r.runUntilEmpty()
	r.checkOrder(ids)
	if n := countEvents[event.LeaderRefreshed](r.events); n != 2 {
		t.Fatalf("%d LeaderRefreshed events after two fatal commits, want 2; events %v", n, r.events.all())
	}
	if r.kafka.producers < 3 {
		t.Fatalf("%d producers: the remarks did not start new epochs", r.kafka.producers)
	}
}

// A transaction that took a lower id but committed after a higher id of the same key was sent
// is published in the order observed, and is no cause for alarm.
func TestLateCommittedLowerIDIsPublished(t *testing.T) {
	r := newRig(t, fastLimits())
	high := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "k", KafkaValue: String("second by id")})
	// Leave a gap below the first record, as a transaction still in progress would.
	r.db.SkipIDs(10)
	r.start()
	r.waitEmpty(10 * time.Second)
	r.db.InsertAt(high[0]-1, driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "k", KafkaValue: String("first by id")})
	r.note(high[0]-1, "k")
	r.waitEmpty(10 * time.Second)
	if r.h.State() != Running {
		t.Fatalf("state %v after a late commit", r.h.State())
	}
	r.stop()
	got := r.kafka.published()
	if len(got) != 2 || got[0].id != high[0] || got[1].id != high[0]-1 {
		t.Fatalf("published %+v, want the higher id then the late lower one", got)
	}
}

// A transaction that took a low id commits while a backlog drains, and its writer then writes the
// key's next record, at the tail: the late record is published first. A claim that read forward
// from the highest id it had read would reach the next record before it went back for the late one.
func TestLateCommitThenNextRecordKeepOrderWhileDraining(t *testing.T) {
	limits := fastLimits()
	limits.MaxInFlightRecords = 20 // every claim comes back full while the backlog lasts
	r := newRig(t, limits)
	r.db.SkipIDs(10) // ids taken by a transaction still open
	late, next := int64(5), int64(1_000_000)
	r.note(late, "late")
	r.note(next, "late")
	ids := r.load(50, 40)
	trigger := ids[100]
	var once sync.Once
	r.kafka.onProduce = func(id int64) {
		if id != trigger {
			return
		}
		once.Do(func() {
			r.db.InsertAt(late, driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "late", KafkaValue: String("committed late")})
			r.db.InsertAt(next, driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "late", KafkaValue: String("written after")})
		})
	}
	r.runUntilEmpty()
	r.checkOrder(append(ids, late, next))
}

func TestRejectedRecordHoldsOnlyItsKey(t *testing.T) {
	r := newRig(t, fastLimits())
	bad := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("too big")})[0]
	after := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("next")})[0]
	others := r.load(20, 10)
	r.kafka.rejectN[bad] = 3
	r.start()
	// Other keys drain while the bad record is retried.
	r.waitFor("other keys to drain", 10*time.Second, func() bool { return r.db.len() <= 2 })
	r.waitEmpty(10 * time.Second)
	r.stop()
	r.checkOrder(append([]int64{bad, after}, others...))
	failures := 0
	for _, e := range r.events.all() {
		if f, ok := e.(event.RecordFailed); ok {
			if f.ID != bad || f.Key != "bad" {
				t.Errorf("RecordFailed for %d (%s), want only %d", f.ID, f.Key, bad)
			}
			failures++
		}
	}
	if failures != 3 {
		t.Errorf("%d RecordFailed events, want one per rejection (3)", failures)
	}
	if n := strings.Count(r.logs.String(), "outbox record rejected"); n != 3 {
		t.Errorf("%d rejection log lines, want 3", n)
	}
	if !strings.Contains(r.logs.String(), fmt.Sprintf("id=%d", bad)) {
		t.Errorf("the log does not name record %d", bad)
	}
	if countEvents[event.LeaderRefreshed](r.events) != 0 {
		t.Errorf("a rejected record caused a remark of everything in flight")
	}
}

func TestMalformedRecordIsHeldAndReported(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		r := newRig(t, fastLimits())
		bad := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad"})[0]
		after := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad"})[0]
		r.db.SetMalformed(bad, "header arrays differ")
		others := r.load(10, 10)
		r.start()
		r.waitFor("other keys to drain", 10*time.Second, func() bool { return r.db.len() == 2 })
		advanceTo(time.Now().Add(100 * time.Millisecond)) // a gap in which the held key's records must not go out
		r.stop()
		r.checkOrder(others)
		if !r.db.exists(bad) || !r.db.exists(after) {
			t.Fatal("the malformed record or its successor was dropped")
		}
		for _, p := range r.kafka.published() {
			if p.key == "bad" {
				t.Fatalf("record %d of the held key was published", p.id)
			}
		}
		var reported bool
		for _, e := range r.events.all() {
			if f, ok := e.(event.RecordFailed); ok && f.ID == bad && strings.Contains(f.Err.Error(), "header arrays differ") {
				reported = true
			}
		}
		if !reported {
			t.Fatalf("no RecordFailed for the malformed record; events %v", r.events.all())
		}
	})
}

// A failed mark may have marked rows whose reply was lost, which only a new leader ID takes
// back: the epoch ends. A failed read changed nothing: the epoch reads again.
func TestFailedClaimRemarksOnlyAMark(t *testing.T) {
	r := newRig(t, fastLimits())
	ids := r.load(5, 20)
	r.db.failMk = 2
	r.start()
	r.waitEmpty(10 * time.Second)
	r.stop()
	r.checkOrder(ids)
	n := countEvents[event.LeaderRefreshed](r.events)
	if claimStrategy == ClaimByMarking && n < 2 {
		t.Fatalf("%d LeaderRefreshed events after two failed marks, want 2", n)
	}
	if claimStrategy == ClaimByReading && n != 0 {
		t.Fatalf("%d LeaderRefreshed events after two failed reads, want none", n)
	}
}

// During a database outage the harvester backs off, logs the outage once, and still stops
// promptly; when the database returns it carries on.
func TestDatabaseOutage(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		r := newRig(t, fastLimits())
		r.kafka.delay = time.Millisecond
		ids := r.load(20, 30)
		r.start()
		r.waitFor("some progress", 10*time.Second, func() bool { return r.db.len() < len(ids) })
		r.db.setDown(true)
		advanceTo(time.Now().Add(500 * time.Millisecond)) // an outage several retries long
		r.db.setDown(false)
		r.waitEmpty(20 * time.Second)
		// The step that purges the last rows may log the recovery just after: a new epoch's start
		// purges what the last one left, and says the outage is over once it is through.
		r.waitFor("the recovery to be logged", 5*time.Second, func() bool {
			return strings.Contains(r.logs.String(), "database available again")
		})
		if n := strings.Count(r.logs.String(), "database unavailable"); n != 1 {
			t.Errorf("the outage was logged %d times, want once", n)
		}
		r.checkOrder(ids)

		// Stop during a second outage.
		r.load(5, 2)
		marks := r.db.markCount()
		r.db.setDown(true)
		// The loops are retrying when Stop comes: a claim has failed, and every loop has met the
		// outage or waits.
		r.waitFor("a claim to fail", 5*time.Second, func() bool { return r.db.markCount() > marks })
		synctest.Wait()
		start := time.Now()
		r.stop()
		if took := time.Since(start); took > 3*time.Second {
			t.Fatalf("Stop took %v during a database outage", took)
		}
	})
}

// A statement stuck on a locked table must not hold up Stop beyond its bound.
func TestStopWhileDatabaseHangs(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		r := newRig(t, fastLimits())
		r.kafka.delay = time.Millisecond
		ids := r.load(20, 30)
		r.start()
		r.waitFor("some progress", 10*time.Second, func() bool { return r.db.len() < len(ids) })
		hung := r.hung()
		r.db.setHang(true)
		// Statements are stuck when Stop comes: one has met the hang, and every loop has too or waits.
		r.waitFor("a statement to hang", 5*time.Second, func() bool { return r.hung() > hung })
		synctest.Wait()
		start := time.Now()
		r.stop()
		// MaxPollInterval (500ms) to drain, then the stuck statements are cancelled.
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("Stop took %v while the database hung", took)
		}
	})
}

func TestIdleOutboxBacksOff(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		r := newRig(t, epoch.Limits{HeartbeatTimeout: time.Second, MinPollInterval: 10 * time.Millisecond})
		r.start()
		r.waitFor("leadership", 5*time.Second, r.h.IsLeader)
		from := advanceTo(time.Now().Add(time.Second)) // the backoff climbs to its bound
		before := r.db.markCount()
		advanceTo(from.Add(3 * time.Second)) // the window the marks are counted over
		perSecond := float64(r.db.markCount()-before) / 3
		if perSecond > 1.4 {
			t.Fatalf("an idle outbox was marked %.1f times a second; the bound (maxMarkBackoff 1s) allows 1", perSecond)
		}
		id := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "k"})[0]
		r.waitFor("the new record", 3*time.Second, func() bool { return !r.db.exists(id) })
		r.stop()
	})
}

// coveringDB is the fake database with a CoveringListener whose notifications and coverage the
// test sends.
type coveringDB struct {
	*fakeDB
	notify chan struct{} // a write's notification
	cover  chan bool     // coverage from now on
}

func (d *coveringDB) Listen(ctx context.Context, wake func()) error {
	return d.ListenCovering(ctx, wake, func(bool) {})
}

func (d *coveringDB) ListenCovering(ctx context.Context, wake func(), covered func(bool)) error {
	covered(true)
	wake()
	for {
		select {
		case <-ctx.Done():
			return nil
		case c := <-d.cover:
			covered(c)
		case <-d.notify:
			wake()
		}
	}
}

// startCovered starts a harvester on the fake database with a coveringDB's listener, inside the
// calling bubble, and returns once it leads and its first claims, after the listener's first
// wake-up, are done: that claim waits for the commit cadence's claim window.
func startCovered(t *testing.T, limits epoch.Limits) (*rig, *coveringDB) {
	r := newRig(t, limits)
	db := &coveringDB{fakeDB: r.db, notify: make(chan struct{}), cover: make(chan bool)}
	r.store = db
	r.start()
	r.waitFor("leadership", 5*time.Second, r.h.IsLeader)
	advanceTo(time.Now().Add(limits.WithDefaults().CommitCadence))
	synctest.Wait()
	return r, db
}

// While its listener covers every write, an idle outbox is not polled at all; a notification
// still wakes it, and once the coverage ends it polls again.
func TestCoveredIdleOutboxIsNotPolled(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		r, db := startCovered(t, fastLimits()) // maxMarkBackoff 20ms: uncovered, 50 marks a second
		before := r.db.markCount()
		advanceTo(time.Now().Add(time.Second))
		if marks := r.db.markCount() - before; marks != 0 {
			t.Fatalf("a covered idle outbox was marked %d times in a second; want none", marks)
		}
		send := func(what string, ch chan<- struct{}) {
			select {
			case ch <- struct{}{}:
			case <-time.After(5 * time.Second):
				t.Fatalf("the listener did not take the %s", what)
			}
		}
		id := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "k"})[0]
		send("notification", db.notify)
		r.waitFor("the notified record", 3*time.Second, func() bool { return !r.db.exists(id) })

		select {
		case db.cover <- false:
		case <-time.After(5 * time.Second):
			t.Fatal("the listener did not take the end of its coverage")
		}
		before = r.db.markCount()
		advanceTo(time.Now().Add(500 * time.Millisecond))
		if marks := r.db.markCount() - before; marks < 5 {
			t.Fatalf("an uncovered idle outbox was marked %d times in half a second; want it polled every 20ms", marks)
		}
		r.stop()
	})
}

// Under a trickle of writes, each notified, a claim that returned fewer rows than it asked for
// has seen every row it could claim: the marker waits for the next notification (or its backoff)
// before it claims again, rather than claim at once and find nothing, which doubled the claims
// of a lightly loaded outbox. The backoff here outlasts the gap between writes, so that every
// claim but the listener's first is a notification's.
func TestTrickleClaimsOncePerNotification(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		limits := fastLimits()
		limits.MarkBackoff, limits.MaxMarkBackoff = 200*time.Millisecond, 200*time.Millisecond
		r, db := startCovered(t, limits)
		before := r.db.markCount()
		const writes = 40
		var ids []int64
		for i := range writes {
			ids = append(ids, r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: fmt.Sprint("k", i)})...)
			select {
			case db.notify <- struct{}{}:
			case <-time.After(5 * time.Second):
				t.Fatal("the listener did not take a notification")
			}
			time.Sleep(20 * time.Millisecond) // the gap between two writes
		}
		claims := r.db.markCount() - before
		r.waitFor("the trickle to be published", 5*time.Second, func() bool { return r.db.len() == 0 })
		r.stop()
		r.checkOrder(ids)
		if claims > writes+writes/10 {
			t.Fatalf("%d writes, each notified, were claimed with %d claims; want about one a notification", writes, claims)
		}
	})
}

// A deposed leader that has not yet noticed can still mark rows, taking them from the current
// leader, whose next mark then returns records it already holds. Those copies must be dropped:
// queued behind the key's later records, they would be published out of order.
func TestRecordsMarkedAgainMidEpochAreNotQueuedTwice(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		r := newRig(t, fastLimits())
		r.kafka.delay = time.Millisecond
		ids := r.load(20, 200)
		r.start()
		r.waitFor("some progress", 10*time.Second, func() bool { return r.db.len() < len(ids) })
		// The deposed leader marks until this leader has taken back at least one record it held (it
		// used to mark at least five times, which a fast machine drains the outbox before). A leader
		// that reads takes nothing back: the deposed leader's marks change nothing it reads.
		pace := time.NewTicker(20 * time.Millisecond) // paces the deposed leader's marks, as its loop would
		defer pace.Stop()
		for marks := 0; claimStrategy == ClaimByMarking && testutil.ToFloat64(r.h.metrics.MarkedAgain) == 0 ||
			claimStrategy == ClaimByReading && marks < 5 && r.db.len() > 0; marks++ {
			marked, err := r.db.Mark(context.Background(), uuid.New(), 200) // the deposed leader's mark
			if err != nil {
				t.Fatal(err)
			}
			if len(marked) == 0 && claimStrategy == ClaimByMarking {
				t.Fatal("nothing was left to mark again")
			}
			<-pace.C
		}
		r.waitEmpty(20 * time.Second)
		r.stop()
		r.checkOrder(ids)
		if dups := len(r.kafka.published()) - len(ids); dups != 0 {
			t.Errorf("%d records published twice by one leader", dups)
		}
		if again := testutil.ToFloat64(r.h.metrics.MarkedAgain); claimStrategy == ClaimByMarking && again == 0 {
			t.Error("no record was counted as marked again")
		}
	})
}

// On a revoke the epoch drains before the next begins: the fake producer flags any overlap of
// producers and any message sent through an old one.
func TestRevokeAndFenceEndTheEpochBeforeTheNext(t *testing.T) {
	limits := fastLimits()
	limits.MaxKeyRun = 1 // slow enough that the backlog outlasts the revoke and the fence
	r := newRig(t, limits)
	r.kafka.delay = 5 * time.Millisecond
	ids := r.load(50, 20)
	r.start()
	r.waitFor("some progress", 10*time.Second, func() bool { return r.db.len() < len(ids)-100 })

	r.elector.revoke()
	r.waitFor("the revoke to be noticed", 5*time.Second, func() bool { return !r.h.IsLeader() })
	r.elector.set(stateLeader)
	r.waitFor("progress after re-election", 10*time.Second, func() bool { return r.db.len() < len(ids)-400 })

	// Fence: no barrier, the owner notices on its next pulse.
	r.elector.set(stateFenced)
	r.waitFor("the fence to be noticed", 5*time.Second, func() bool { return !r.h.IsLeader() })
	r.elector.set(stateLeader)
	r.waitEmpty(20 * time.Second)
	r.stop()
	r.checkOrder(ids)
	if n := countEvents[event.LeaderFenced](r.events); n != 1 {
		t.Errorf("%d LeaderFenced events, want 1; events %v", n, r.events.all())
	}
	if n := countEvents[event.LeaderRevoked](r.events); n != 2 {
		t.Errorf("%d LeaderRevoked events, want 2 (the revoke, and Stop)", n)
	}
	if n := countEvents[event.LeaderAcquired](r.events); n != 3 {
		t.Errorf("%d LeaderAcquired events, want 3", n)
	}
	if r.kafka.producers < 3 {
		t.Errorf("%d producers for three epochs", r.kafka.producers)
	}
}

func TestStopMidRunThenStartAgain(t *testing.T) {
	r := newRig(t, fastLimits())
	// Enough records, each a little slow, that a loaded machine's poll of the progress cannot
	// miss the whole run.
	r.kafka.delay = 2 * time.Millisecond
	ids := r.load(50, 60)
	r.start()
	r.waitFor("some progress", 10*time.Second, func() bool { return r.db.len() < len(ids)-200 })
	r.stop()
	if r.db.len() == 0 {
		t.Fatal("the run finished before Stop; nothing left to test")
	}
	r.elector.set(stateLeader)
	r.h = r.newHarvest(fastLimits())
	r.runUntilEmpty()
	r.checkOrder(ids)
}

func TestLifecycle(t *testing.T) {
	r := newRig(t, fastLimits())
	if err := r.h.Await(); err != nil || r.h.State() != Created {
		t.Fatalf("Await before Start: %v, state %v", err, r.h.State())
	}
	r.start()
	if err := r.h.Start(); err == nil {
		t.Fatal("a second Start succeeded")
	}
	r.stop()
	if r.h.State() != Stopped || !r.elector.closed() {
		t.Fatalf("state %v, elector closed %v", r.h.State(), r.elector.closed())
	}
}

func TestMetricsCountWhatHappened(t *testing.T) {
	r := newRig(t, fastLimits())
	ids := r.load(20, 20)
	r.kafka.rejectN[ids[5]] = 2
	r.start()
	r.waitEmpty(20 * time.Second)
	m := r.h.metrics
	if got := testutil.ToFloat64(m.Leader); got != 1 {
		t.Errorf("goharvest_leader = %v while leading", got)
	}
	n, err := testutil.GatherAndCount(r.registry, "goharvest_records_published_total", "goharvest_in_flight_records", "goharvest_errors_total")
	if err != nil || n < 3 {
		t.Errorf("gathered %d series, %v", n, err)
	}
	r.stop()
	want := map[string]float64{
		"published": float64(len(ids)), "purged": float64(len(ids)), "failed": 2, "elections": 1, "leader": 0,
	}
	got := map[string]float64{
		"published": testutil.ToFloat64(m.Published), "purged": testutil.ToFloat64(m.Purged),
		"failed": testutil.ToFloat64(m.Failed), "elections": testutil.ToFloat64(m.Elections), "leader": testutil.ToFloat64(m.Leader),
	}
	for k, w := range want {
		if got[k] != w {
			t.Errorf("%s = %v, want %v", k, got[k], w)
		}
	}
	if marked := testutil.ToFloat64(m.Marked); marked < float64(len(ids)) {
		t.Errorf("marked %v < %d records", marked, len(ids))
	}
	if testutil.CollectAndCount(m.CommitSeconds) != 1 || testutil.CollectAndCount(m.MarkSeconds) != 1 {
		t.Error("latency histograms missing")
	}
	if n, _ := testutil.GatherAndCount(r.registry); n != 0 {
		t.Errorf("%d series still registered after Stop", n)
	}
}

func TestTwoHarvestersWithOneNameCannotShareARegistry(t *testing.T) {
	r := newRig(t, fastLimits())
	r.start()
	other := r.newHarvest(fastLimits())
	if err := other.Start(); err == nil || !strings.Contains(err.Error(), "register metrics") {
		other.Stop()
		t.Fatalf("a second harvester named like the first started: %v", err)
	}
}

func TestHealthyAndReady(t *testing.T) {
	r := newRig(t, fastLimits())
	ctx := context.Background()
	if err := r.h.Healthy(); err == nil {
		t.Fatal("healthy before Start")
	}
	r.start()
	if err := r.h.Healthy(); err != nil {
		t.Fatal(err)
	}
	if err := r.h.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	r.db.setDown(true)
	if err := r.h.Ready(ctx); err == nil || !strings.Contains(err.Error(), "database") {
		t.Fatalf("ready with the database down: %v", err)
	}
	if err := r.h.Healthy(); err != nil {
		t.Fatalf("a database outage made the process unhealthy: %v", err)
	}
	r.db.setDown(false)
	if err := r.h.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	r.stop()
	if err := r.h.Healthy(); err == nil {
		t.Fatal("healthy after Stop")
	}
}
