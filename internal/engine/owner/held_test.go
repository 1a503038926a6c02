package owner

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/epoch"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

func (k *fakeKafka) setReject(id int64, n int) {
	k.mu.Lock()
	k.rejectN[id] = n
	k.mu.Unlock()
}

// waitBudgetEmpty checks the in-flight count once the outbox is empty: every record counted
// against MaxInFlightRecords must have been taken off again, exactly once.
func (r *rig) waitBudgetEmpty() {
	r.t.Helper()
	p := r.h.current()
	if p == nil {
		r.t.Fatal("not leading")
	}
	count := func() int { _, n := p.InFlight(); return n }
	if !testwait.Until(5*time.Second, func() bool { return count() == 0 }) {
		r.t.Fatalf("%d records still counted in flight with the outbox empty", count())
	}
}

// heldLimits keeps the in-flight budget far below the rows queued behind a bad record.
func heldLimits() epoch.Limits {
	l := fastLimits()
	l.MaxKeyRun = 1
	l.MaxInFlightRecords = 50
	l.MarkQueryRecords = 20
	l.HeldCheckInterval = 20 * time.Millisecond
	return l
}

// A key held by a record Kafka keeps refusing, with more rows behind it than the in-flight budget,
// holds back only itself; once the record goes through, its key follows in order.
func TestHeldKeyWithManyRowsHoldsOnlyItself(t *testing.T) {
	for _, run := range []int{1, 100} {
		t.Run(fmt.Sprint("maxKeyRun=", run), func(t *testing.T) { heldKeyWithManyRows(t, run) })
	}
}

func heldKeyWithManyRows(t *testing.T, maxKeyRun int) {
	l := heldLimits()
	l.MaxKeyRun = maxKeyRun
	r := newRig(t, l)
	var recs []driver.OutboxRecord
	for i := range 201 {
		recs = append(recs, driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String(fmt.Sprint(i))})
	}
	bad := r.add(recs...)
	others := r.load(20, 10)
	r.kafka.setReject(bad[0], 1<<30)
	r.start()
	r.waitFor("other keys to drain past the held key", 10*time.Second, func() bool { return r.db.len() == len(bad) })
	for _, p := range r.kafka.published() {
		if p.key == "bad" {
			t.Fatalf("record %d of the held key was published before the held record", p.id)
		}
	}
	if n := len(r.h.HeldRecords()); n != 1 {
		t.Errorf("%d held records listed, want 1: %+v", n, r.h.HeldRecords())
	}
	r.kafka.setReject(bad[0], 0)
	r.waitEmpty(30 * time.Second)
	r.waitBudgetEmpty()
	r.stop()
	r.checkOrder(append(bad, others...))
}

// A malformed row with more rows behind it than the in-flight budget holds back only its key.
func TestMalformedKeyWithManyRowsHoldsOnlyItself(t *testing.T) {
	r := newRig(t, heldLimits())
	var recs []driver.OutboxRecord
	for range 120 {
		recs = append(recs, driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("v")})
	}
	bad := r.add(recs...)
	r.db.SetMalformed(bad[0], "header arrays differ")
	others := r.load(20, 10)
	r.start()
	r.waitFor("other keys to drain past the held key", 10*time.Second, func() bool { return r.db.len() == len(bad) })
	// The operator fixes the row: it is read afresh and published, then its key follows.
	r.db.SetMalformed(bad[0], "")
	r.db.update(bad[0], func(rec *driver.OutboxRecord) { rec.KafkaValue = String("fixed") })
	r.waitEmpty(10 * time.Second)
	r.waitBudgetEmpty()
	r.stop()
	r.checkOrder(append(bad, others...))
	for _, p := range r.kafka.published() {
		if p.id == bad[0] && (p.value == nil || *p.value != "fixed") {
			t.Errorf("record %d published with %v, want the fixed content", p.id, p.value)
		}
	}
}

// An operator's delete of a held row drops the record and releases its key within about a
// HeldCheckInterval, however long its backoff; the deleted row is never published.
func TestDeletedHeldRecordIsDroppedAndItsKeyReleased(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		l := heldLimits()
		l.IOErrorBackoff = time.Minute // the retry would come far too late: the re-read must act
		r := newRig(t, l)
		ids := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("0")},
			driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("1")})
		r.kafka.setReject(ids[0], 1<<30)
		r.start()
		r.waitFor("the record to be held", 5*time.Second, func() bool { return len(r.h.HeldRecords()) == 1 })
		r.db.Delete(ids[0])
		r.waitEmpty(5 * time.Second)
		r.waitBudgetEmpty()
		r.stop()
		for _, p := range r.kafka.published() {
			if p.id == ids[0] {
				t.Fatalf("the deleted record %d was published", p.id)
			}
		}
		r.checkOrder(ids[1:])
		if n := countEvents[event.HeldRecordDeleted](r.events); n != 1 {
			t.Errorf("%d HeldRecordDeleted events, want 1", n)
		}
	})
}

// The held loop ticks only while a record is held: once the registry has emptied, the next record
// held is read again every HeldCheckInterval as the first was, and an operator's delete of it
// takes effect as promptly.
func TestHeldLoopTicksAgainForTheNextHeldRecord(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		l := heldLimits()
		l.IOErrorBackoff = time.Minute // the retry would come far too late: the re-read must act
		r := newRig(t, l)
		first := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "a", KafkaValue: String("0")})
		r.kafka.setReject(first[0], 1<<30)
		r.start()
		r.waitFor("the first record to be held", 5*time.Second, func() bool { return len(r.h.HeldRecords()) == 1 })
		r.db.Delete(first[0])
		// Long before the backoff ends: only the held loop's re-read drops it.
		r.waitFor("the first record to be dropped", 5*time.Second, func() bool { return len(r.h.HeldRecords()) == 0 })
		// Several intervals with nothing held, so that the loop has seen the registry empty.
		advanceTo(time.Now().Add(5 * l.HeldCheckInterval))
		next := first[0] + 1 // the store numbers rows in order
		r.kafka.setReject(next, 1<<30)
		second := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "b", KafkaValue: String("1")})
		if second[0] != next {
			t.Fatalf("the second row is %d, want %d", second[0], next)
		}
		r.waitFor("the second record to be held", 5*time.Second, func() bool { return len(r.h.HeldRecords()) == 1 })
		r.db.Delete(second[0])
		r.waitFor("the second record to be dropped", 5*time.Second, func() bool { return len(r.h.HeldRecords()) == 0 })
		r.stop()
		for _, p := range r.kafka.published() {
			t.Fatalf("record %d was published; both rows were deleted while held", p.id)
		}
		if n := countEvents[event.HeldRecordDeleted](r.events); n != 2 {
			t.Errorf("%d HeldRecordDeleted events, want 2: %+v", n, r.events.all())
		}
	})
}

// An operator's fix of a held row is published at once, with its new content, and never the old.
func TestFixedHeldRecordIsSentWithItsNewContent(t *testing.T) {
	l := heldLimits()
	l.IOErrorBackoff = time.Minute
	r := newRig(t, l)
	ids := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("too big")},
		driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("next")})
	r.kafka.setReject(ids[0], 1)
	r.start()
	r.waitFor("the record to be held", 5*time.Second, func() bool { return len(r.h.HeldRecords()) == 1 })
	r.db.update(ids[0], func(rec *driver.OutboxRecord) { rec.KafkaValue = String("fixed") })
	r.waitEmpty(5 * time.Second)
	r.stop()
	r.checkOrder(ids)
	for _, p := range r.kafka.published() {
		if p.id == ids[0] && *p.value != "fixed" {
			t.Errorf("record %d published with %q, want only the fixed content", p.id, *p.value)
		}
	}
}

// A row changed after it was read and sent, while its old content waits in the producer, is not
// committed: the transaction is aborted and the new content sent instead.
func TestRowChangedWhileBeingSentIsNotCommitted(t *testing.T) {
	r := newRig(t, heldLimits())
	ids := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("v1")},
		driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("next")})
	r.kafka.setReject(ids[0], 1)
	changed := false
	r.kafka.onProduce = func(id int64) {
		// The first send after the re-read carries v1; the operator's fix lands just after it.
		if id == ids[0] && len(r.h.HeldRecords()) == 1 && !changed {
			changed = true
			r.db.update(ids[0], func(rec *driver.OutboxRecord) { rec.KafkaValue = String("v2") })
		}
	}
	r.start()
	r.waitEmpty(10 * time.Second)
	r.waitBudgetEmpty()
	r.stop()
	values := r.publishedValues()
	want := []string{fmt.Sprintf("%d:v2", ids[0]), fmt.Sprintf("%d:next", ids[1])}
	if fmt.Sprint(values) != fmt.Sprint(want) {
		t.Fatalf("published %v, want %v", values, want)
	}
}

// A row changed in the last moment, after the pre-commit check, is committed with its old
// content but not purged: its new content follows, so the correction is not lost.
func TestRowChangedAtCommitIsPublishedAgain(t *testing.T) {
	r := newRig(t, heldLimits())
	ids := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("v1")},
		driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("next")})
	r.kafka.setReject(ids[0], 1)
	var sentAfterRead atomic.Bool
	r.kafka.onProduce = func(id int64) {
		if id == ids[0] && len(r.h.HeldRecords()) == 1 {
			sentAfterRead.Store(true)
		}
	}
	changed := false
	r.kafka.onCommit = func() {
		if sentAfterRead.Load() && !changed {
			changed = true
			r.db.update(ids[0], func(rec *driver.OutboxRecord) { rec.KafkaValue = String("v2") })
		}
	}
	r.start()
	r.waitEmpty(10 * time.Second)
	r.waitBudgetEmpty()
	r.stop()
	values := r.publishedValues()
	want := []string{fmt.Sprintf("%d:v1", ids[0]), fmt.Sprintf("%d:v2", ids[0]), fmt.Sprintf("%d:next", ids[1])}
	if fmt.Sprint(values) != fmt.Sprint(want) {
		t.Fatalf("published %v, want %v", values, want)
	}
}

// With dead letters on, a record past its attempts is moved to the dead-letter table and its
// key's later records go on without it.
func TestDeadLetterAfterAttempts(t *testing.T) {
	l := heldLimits()
	l.DeadLetterAttempts = 3
	r := newRig(t, l)
	ids := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("0")},
		driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("1")})
	r.kafka.setReject(ids[0], 1<<30)
	r.start()
	r.waitEmpty(10 * time.Second)
	r.waitBudgetEmpty()
	r.stop()
	r.checkOrder(ids[1:])
	info, ok := r.db.DeadLetters()[ids[0]]
	if !ok {
		t.Fatalf("record %d not in the dead-letter table", ids[0])
	}
	if info.Attempts != 3 || info.Err == "" || info.FirstFailure.IsZero() || info.LastFailure.Before(info.FirstFailure) {
		t.Errorf("dead letter recorded as %+v", info)
	}
	if n := countEvents[event.RecordDeadLettered](r.events); n != 1 {
		t.Errorf("%d RecordDeadLettered events, want 1", n)
	}
	if n := testutil.ToFloat64(r.h.metrics.DeadLettered); n != 1 {
		t.Errorf("goharvest_records_dead_lettered_total = %v, want 1", n)
	}
}

// Dead letters are off by default: a record that keeps failing stays held.
func TestNoDeadLettersByDefault(t *testing.T) {
	r := newRig(t, heldLimits())
	ids := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("0")})
	r.kafka.setReject(ids[0], 1<<30)
	r.start()
	r.waitFor("several attempts", 10*time.Second, func() bool {
		held := r.h.HeldRecords()
		return len(held) == 1 && held[0].Attempts >= 4
	})
	r.stop()
	if !r.db.exists(ids[0]) || len(r.db.DeadLetters()) != 0 {
		t.Fatal("a held record was moved although dead letters are off")
	}
}

// A held row given another key leaves its old key's order for its new key's: the old key is
// released, and the row is published with the new key.
func TestHeldRowGivenAnotherKeyMovesToThatKey(t *testing.T) {
	l := heldLimits()
	l.IOErrorBackoff = time.Minute
	r := newRig(t, l)
	ids := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "a", KafkaValue: String("0")},
		driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "a", KafkaValue: String("1")})
	r.kafka.setReject(ids[0], 1)
	r.start()
	r.waitFor("the record to be held", 5*time.Second, func() bool { return len(r.h.HeldRecords()) == 1 })
	r.db.update(ids[0], func(rec *driver.OutboxRecord) { rec.KafkaKey = "b" })
	r.waitEmpty(5 * time.Second)
	r.stop()
	keys := map[int64][]string{}
	for _, p := range r.kafka.published() {
		keys[p.id] = append(keys[p.id], p.key)
	}
	if fmt.Sprint(keys[ids[0]]) != "[b]" || fmt.Sprint(keys[ids[1]]) != "[a]" {
		t.Fatalf("published keys %v; want record %d once under b and %d under a", keys, ids[0], ids[1])
	}
}

// A remark does not reset a held record's failures: the dead-letter limits count from its first
// failure and its attempts go on.
func TestHeldRecordFailuresSurviveARemark(t *testing.T) {
	r := newRig(t, heldLimits())
	ids := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String("0")})
	r.kafka.setReject(ids[0], 1<<30)
	r.start()
	var first event.HeldRecord
	r.waitFor("two attempts", 5*time.Second, func() bool {
		held := r.h.HeldRecords()
		if len(held) == 1 && held[0].Attempts >= 2 {
			first = held[0]
			return true
		}
		return false
	})
	r.kafka.mu.Lock()
	r.kafka.produceFatal = true // the next send fails fatally: a new epoch claims the record again
	r.kafka.mu.Unlock()
	r.waitFor("a remark and the record held again", 10*time.Second, func() bool {
		held := r.h.HeldRecords()
		return countEvents[event.LeaderRefreshed](r.events) >= 1 && len(held) == 1 && held[0].Attempts > first.Attempts
	})
	held := r.h.HeldRecords()[0]
	r.stop()
	if !held.Since.Equal(first.Since) {
		t.Errorf("held since %v after the remark, want the first failure %v", held.Since, first.Since)
	}
}

// publishedValues lists what reached the broker, in order, as "id:value".
func (r *rig) publishedValues() []string {
	var values []string
	for _, p := range r.kafka.published() {
		values = append(values, fmt.Sprintf("%d:%s", p.id, *p.value))
	}
	return values
}
