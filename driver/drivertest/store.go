package drivertest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/outbox"
)

// Outbox is an empty outbox under test: the store the engine uses, and a way to change its rows
// as writers and operators do.
type Outbox struct {
	Store driver.Store
	// Insert writes rows in order, each in a transaction of its own, and returns their ids.
	Insert func(t *testing.T, recs ...driver.OutboxRecord) []int64
	// SetValue changes a row's value, as an operator's fix would.
	SetValue func(t *testing.T, id int64, value string)
	// Delete deletes a row, as an operator would.
	Delete func(t *testing.T, id int64)
	// Exists reports whether the row is still in the outbox.
	Exists func(t *testing.T, id int64) bool
	// InsertMalformed writes a row that cannot become a message (its header keys and values
	// differ in number) and returns its id.
	InsertMalformed func(t *testing.T, key string) int64
}

// RunStore runs the store contract, each rule in a subtest on an outbox of its own from open.
func RunStore(t *testing.T, open func(t *testing.T) Outbox) {
	for _, c := range []struct {
		name string
		test func(t *testing.T, o Outbox)
	}{
		{"MarkReturnsTheOldestInIDOrder", markReturnsTheOldestInIDOrder},
		{"MarkTakesOverOtherLeadersRows", markTakesOverOtherLeadersRows},
		{"MarkExceptLeavesHeldKeysAlone", markExceptLeavesHeldKeysAlone},
		{"RecordsComeBackAsWritten", recordsComeBackAsWritten},
		{"RereadReturnsWhatAClaimReturned", rereadReturnsWhatAClaimReturned},
		{"MalformedRowComesBackWithItsError", malformedRowComesBackWithItsError},
		{"PurgeDeletesAndIgnoresMissing", purgeDeletesAndIgnoresMissing},
		{"ResetReleasesOnlyOwnRows", resetReleasesOnlyOwnRows},
		{"RereadVersionsFollowContent", rereadVersionsFollowContent},
		{"PurgeUnchangedKeepsChangedRows", purgeUnchangedKeepsChangedRows},
		{"DeadLetterMovesOnlyTheVersionRead", deadLetterMovesOnlyTheVersionRead},
		{"ReadChangesNothing", readChangesNothing},
		{"ReadLeavesOutExcludedAndHeld", readLeavesOutExcludedAndHeld},
	} {
		t.Run(c.name, func(t *testing.T) { c.test(t, open(t)) })
	}
}

func record(key, value string) driver.OutboxRecord {
	return driver.OutboxRecord{CreateTime: now(), KafkaTopic: "topic", KafkaKey: key, KafkaValue: &value}
}

// now is the time to write a record with, to the microsecond that Postgres keeps.
func now() time.Time { return time.Now().Truncate(time.Microsecond) }

func ids(recs []driver.MarkedRecord) []int64 {
	out := make([]int64, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

func mark(t *testing.T, s driver.Store, leader uuid.UUID, limit int, held ...string) []int64 {
	t.Helper()
	recs, err := s.MarkExcept(context.Background(), leader, limit, held)
	if err != nil {
		t.Fatalf("mark: %v", err)
	}
	for _, r := range recs {
		if r.LeaderID == nil || *r.LeaderID != leader {
			t.Errorf("record %d marked comes back with leader %v, want %v", r.ID, r.LeaderID, leader)
		}
	}
	return ids(recs)
}

func wantIDs(t *testing.T, what string, got, want []int64) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: %v, want %v", what, got, want)
	}
}

// A mark returns up to limit of the oldest rows not marked by its leader, in id order; the same
// leader's next mark returns the next ones, and then none.
func markReturnsTheOldestInIDOrder(t *testing.T, o Outbox) {
	ids := o.Insert(t, record("a", "1"), record("b", "1"), record("a", "2"), record("c", "1"), record("b", "2"))
	leader := uuid.New()
	wantIDs(t, "first mark", mark(t, o.Store, leader, 3), ids[:3])
	wantIDs(t, "second mark", mark(t, o.Store, leader, 3), ids[3:])
	wantIDs(t, "third mark", mark(t, o.Store, leader, 3), nil)
	recs, err := o.Store.Mark(context.Background(), leader, 10)
	if err != nil || len(recs) != 0 {
		t.Errorf("Mark after everything is marked: %d records, %v", len(recs), err)
	}
}

// A new leader ID takes over every row an earlier one marked: that is how a new epoch gets back
// what the last one left in flight.
func markTakesOverOtherLeadersRows(t *testing.T, o Outbox) {
	ids := o.Insert(t, record("a", "1"), record("b", "1"))
	mark(t, o.Store, uuid.New(), 10)
	wantIDs(t, "a new leader's mark", mark(t, o.Store, uuid.New(), 10), ids)
}

// Rows of held keys are left unmarked, so that they cannot overtake the held record, and are
// marked once the key is no longer held.
func markExceptLeavesHeldKeysAlone(t *testing.T, o Outbox) {
	ids := o.Insert(t, record("held", "1"), record("free", "1"), record("held", "2"), record("other", "1"))
	leader := uuid.New()
	wantIDs(t, "mark with a held key", mark(t, o.Store, leader, 10, "held", "unknown"), []int64{ids[1], ids[3]})
	wantIDs(t, "mark once released", mark(t, o.Store, leader, 10), []int64{ids[0], ids[2]})
}

// What a mark returns is what was written: topic, key, value (nil for a tombstone, empty for an
// empty value), headers in order with repeated keys, and the creation time.
func recordsComeBackAsWritten(t *testing.T, o Outbox) {
	value, empty := "value", ""
	written := []driver.OutboxRecord{
		{CreateTime: now(), KafkaTopic: "t1", KafkaKey: "k1", KafkaValue: &value,
			KafkaHeaders: outbox.Headers{{Key: "h", Value: "1"}, {Key: "g", Value: "2"}, {Key: "h", Value: "3"}}},
		{CreateTime: now().Add(-time.Hour), KafkaTopic: "t2", KafkaKey: "", KafkaValue: nil},
		{CreateTime: now(), KafkaTopic: "t3", KafkaKey: "k3", KafkaValue: &empty},
	}
	ids := o.Insert(t, written...)
	recs, err := o.Store.Mark(context.Background(), uuid.New(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(written) {
		t.Fatalf("marked %d records, want %d", len(recs), len(written))
	}
	for i, r := range recs {
		w := written[i]
		if r.ID != ids[i] || r.KafkaTopic != w.KafkaTopic || r.KafkaKey != w.KafkaKey || r.Err != nil {
			t.Errorf("record %d came back as id %d topic %q key %q err %v; written as topic %q key %q",
				ids[i], r.ID, r.KafkaTopic, r.KafkaKey, r.Err, w.KafkaTopic, w.KafkaKey)
		}
		if (r.KafkaValue == nil) != (w.KafkaValue == nil) || (w.KafkaValue != nil && *r.KafkaValue != *w.KafkaValue) {
			t.Errorf("record %d: value %v, written %v", r.ID, deref(r.KafkaValue), deref(w.KafkaValue))
		}
		if len(r.KafkaHeaders) != len(w.KafkaHeaders) || !slices.Equal(r.KafkaHeaders, w.KafkaHeaders) && len(w.KafkaHeaders) > 0 {
			t.Errorf("record %d: headers %v, written %v", r.ID, r.KafkaHeaders, w.KafkaHeaders)
		}
		if !r.CreateTime.Equal(w.CreateTime) {
			t.Errorf("record %d: creation time %v, written %v", r.ID, r.CreateTime, w.CreateTime)
		}
	}
}

// A row read afresh comes back exactly as a claim returned it: the next epoch tells a noted
// record's row from a new one that took its id by comparing what it reads afresh with what was
// published (the engine's note fingerprints), so any difference would leave published rows
// behind, to be published again.
func rereadReturnsWhatAClaimReturned(t *testing.T, o Outbox) {
	value, empty := "value", ""
	ids := o.Insert(t,
		driver.OutboxRecord{CreateTime: now(), KafkaTopic: "t1", KafkaKey: "k1", KafkaValue: &value,
			KafkaHeaders: outbox.Headers{{Key: "h", Value: "1"}, {Key: "h", Value: "2"}}},
		driver.OutboxRecord{CreateTime: now().Add(-time.Hour), KafkaTopic: "t2", KafkaKey: "", KafkaValue: nil},
		driver.OutboxRecord{CreateTime: now(), KafkaTopic: "t3", KafkaKey: "k3", KafkaValue: &empty})
	claimed, err := o.Store.Mark(context.Background(), uuid.New(), 10)
	if err != nil {
		t.Fatal(err)
	}
	reread, err := o.Store.Reread(context.Background(), ids)
	if err != nil {
		t.Fatal(err)
	}
	byID := map[int64]driver.OutboxRecord{}
	for _, r := range reread {
		byID[r.ID] = r.OutboxRecord
	}
	for _, c := range claimed {
		r, ok := byID[c.ID]
		switch {
		case !ok:
			t.Errorf("record %d was not read afresh", c.ID)
		case !r.CreateTime.Equal(c.CreateTime) || r.CreateTime.UnixMicro() != c.CreateTime.UnixMicro():
			t.Errorf("record %d: creation time %v afresh, %v claimed", c.ID, r.CreateTime, c.CreateTime)
		case r.KafkaTopic != c.KafkaTopic || r.KafkaKey != c.KafkaKey:
			t.Errorf("record %d: topic %q key %q afresh, %q %q claimed", c.ID, r.KafkaTopic, r.KafkaKey, c.KafkaTopic, c.KafkaKey)
		case (r.KafkaValue == nil) != (c.KafkaValue == nil) || r.KafkaValue != nil && *r.KafkaValue != *c.KafkaValue:
			t.Errorf("record %d: value %v afresh, %v claimed", c.ID, deref(r.KafkaValue), deref(c.KafkaValue))
		case !slices.Equal(r.KafkaHeaders, c.KafkaHeaders) && len(r.KafkaHeaders)+len(c.KafkaHeaders) > 0:
			t.Errorf("record %d: headers %v afresh, %v claimed", c.ID, r.KafkaHeaders, c.KafkaHeaders)
		}
	}
}

// A row that cannot become a message is still marked and returned in its place, with a
// RecordError that names it, so that the engine holds back its key rather than skip it; a read
// afresh says the same.
func malformedRowComesBackWithItsError(t *testing.T, o Outbox) {
	before := o.Insert(t, record("k", "1"))
	bad := o.InsertMalformed(t, "k")
	after := o.Insert(t, record("k", "2"))
	recs, err := o.Store.Mark(context.Background(), uuid.New(), 10)
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "marked", ids(recs), []int64{before[0], bad, after[0]})
	for _, r := range recs {
		var recErr *driver.RecordError
		isBad := errors.As(r.Err, &recErr) && recErr.ID == bad
		if (r.ID == bad) != isBad || (r.ID != bad && r.Err != nil) {
			t.Errorf("record %d came back with error %v", r.ID, r.Err)
		}
	}
	if r := reread(t, o.Store, bad)[bad]; r.Err == nil {
		t.Error("the malformed row read afresh has no error")
	}
}

// Purge deletes the rows given, whoever marked them, counts only the rows it deleted, and
// ignores ids that are gone.
func purgeDeletesAndIgnoresMissing(t *testing.T, o Outbox) {
	ids := o.Insert(t, record("a", "1"), record("b", "1"), record("c", "1"))
	mark(t, o.Store, uuid.New(), 1)
	n, err := o.Store.Purge(context.Background(), []int64{ids[0], ids[1], ids[2] + 1000})
	if err != nil || n != 2 {
		t.Fatalf("Purge = %d, %v; want 2", n, err)
	}
	if o.Exists(t, ids[0]) || o.Exists(t, ids[1]) || !o.Exists(t, ids[2]) {
		t.Error("Purge deleted the wrong rows")
	}
	if n, err := o.Store.Purge(context.Background(), []int64{ids[0]}); err != nil || n != 0 {
		t.Errorf("Purge of a purged row = %d, %v; want 0", n, err)
	}
}

// Reset clears only the rows its leader still holds; those are marked again by the same leader.
func resetReleasesOnlyOwnRows(t *testing.T, o Outbox) {
	ids := o.Insert(t, record("a", "1"), record("b", "1"))
	first, second := uuid.New(), uuid.New()
	mark(t, o.Store, first, 1)  // ids[0]
	mark(t, o.Store, second, 2) // takes both
	if n, err := o.Store.Reset(context.Background(), first, ids); err != nil || n != 0 {
		t.Fatalf("Reset by a leader whose rows were taken over = %d, %v; want 0", n, err)
	}
	if n, err := o.Store.Reset(context.Background(), second, ids[:1]); err != nil || n != 1 {
		t.Fatalf("Reset = %d, %v; want 1", n, err)
	}
	wantIDs(t, "mark after a reset", mark(t, o.Store, second, 10), ids[:1])
}

func reread(t *testing.T, s driver.Store, ids ...int64) map[int64]driver.RereadRecord {
	t.Helper()
	rows, err := s.Reread(context.Background(), ids)
	if err != nil {
		t.Fatalf("reread: %v", err)
	}
	out := map[int64]driver.RereadRecord{}
	for _, r := range rows {
		out[r.ID] = r
	}
	return out
}

// A row read afresh has a version that marking leaves alone and a change of content changes; a
// deleted row is missing from the read.
func rereadVersionsFollowContent(t *testing.T, o Outbox) {
	ids := o.Insert(t, record("a", "1"), record("b", "1"))
	before := reread(t, o.Store, ids...)
	mark(t, o.Store, uuid.New(), 10)
	marked := reread(t, o.Store, ids...)
	if marked[ids[0]].Version != before[ids[0]].Version || before[ids[0]].Version == "" {
		t.Errorf("marking changed the version: %q, then %q", before[ids[0]].Version, marked[ids[0]].Version)
	}
	o.SetValue(t, ids[0], "fixed")
	o.Delete(t, ids[1])
	after := reread(t, o.Store, ids...)
	if r, ok := after[ids[0]]; !ok || r.Version == marked[ids[0]].Version || r.KafkaValue == nil || *r.KafkaValue != "fixed" {
		t.Errorf("after a change: %+v, version before %q", r, marked[ids[0]].Version)
	}
	if _, ok := after[ids[1]]; ok {
		t.Error("a deleted row was read")
	}
}

// PurgeUnchanged deletes a row only while it is the version given.
func purgeUnchangedKeepsChangedRows(t *testing.T, o Outbox) {
	ids := o.Insert(t, record("a", "1"), record("b", "1"))
	versions := map[int64]string{}
	for id, r := range reread(t, o.Store, ids...) {
		versions[id] = r.Version
	}
	o.SetValue(t, ids[1], "changed")
	purged, err := o.Store.PurgeUnchanged(context.Background(), versions)
	if err != nil {
		t.Fatal(err)
	}
	wantIDs(t, "purged unchanged", purged, ids[:1])
	if o.Exists(t, ids[0]) || !o.Exists(t, ids[1]) {
		t.Error("PurgeUnchanged deleted the wrong rows")
	}
}

// DeadLetter moves a row only while it is the version read (any version when none is given),
// and says whether it did.
func deadLetterMovesOnlyTheVersionRead(t *testing.T, o Outbox) {
	ids := o.Insert(t, record("a", "1"), record("b", "1"))
	read := reread(t, o.Store, ids...)
	info := driver.DeadLetterInfo{Err: "refused", Attempts: 3, FirstFailure: time.Now().Add(-time.Minute), LastFailure: time.Now()}
	o.SetValue(t, ids[1], "changed")
	for _, c := range []struct {
		id      int64
		version string
		want    bool
	}{
		{ids[0], read[ids[0]].Version, true},
		{ids[1], read[ids[1]].Version, false}, // changed since it was read
		{ids[1], "", true},
		{ids[1], "", false}, // gone already
	} {
		moved, err := o.Store.DeadLetter(context.Background(), c.id, c.version, info)
		if err != nil || moved != c.want {
			t.Errorf("DeadLetter(%d, %q) = %v, %v; want %v", c.id, c.version, moved, err, c.want)
		}
	}
	if o.Exists(t, ids[0]) || o.Exists(t, ids[1]) {
		t.Error("a dead-lettered row is still in the outbox")
	}
}

func deref(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

func read(t *testing.T, o Outbox, limit int, held []string, exclude []int64) []int64 {
	t.Helper()
	r, ok := o.Store.(driver.Reader)
	if !ok {
		t.Fatalf("%T does not read (driver.Reader)", o.Store)
	}
	recs, err := r.Read(context.Background(), limit, held, exclude)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	for _, rec := range recs {
		if rec.LeaderID != nil {
			t.Errorf("record %d read with leader %v, written with none", rec.ID, *rec.LeaderID)
		}
	}
	return ids(recs)
}

// A read returns the oldest rows, in id order, up to its limit, and changes nothing: reading
// again returns the same, and a mark afterwards takes them all.
func readChangesNothing(t *testing.T, o Outbox) {
	ids := o.Insert(t, record("a", "1"), record("b", "1"), record("a", "2"), record("c", "1"))
	wantIDs(t, "read from the head", read(t, o, 3, nil, nil), ids[:3])
	wantIDs(t, "the same read again", read(t, o, 3, nil, nil), ids[:3])
	wantIDs(t, "read leaving out the first two", read(t, o, 10, nil, ids[:2]), ids[2:])
	wantIDs(t, "a mark after reads", mark(t, o.Store, uuid.New(), 10), ids)
}

// A read leaves out the ids it is told to (the epoch's records in flight) and the rows of held
// keys, and still returns the rows beyond them up to its limit.
func readLeavesOutExcludedAndHeld(t *testing.T, o Outbox) {
	ids := o.Insert(t, record("a", "1"), record("held", "1"), record("b", "1"), record("c", "1"), record("held", "2"))
	got := read(t, o, 2, []string{"held"}, []int64{ids[0]})
	wantIDs(t, "read leaving out a record in flight and a held key", got, []int64{ids[2], ids[3]})
	wantIDs(t, "read with nothing left out", read(t, o, 10, nil, []int64{}), ids)
}
