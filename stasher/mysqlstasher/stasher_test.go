package mysqlstasher_test

import (
	"context"
	"database/sql"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/mysql"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher/mysqlstasher"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(mariadbtest.Run(m))) }

// setup makes an empty outbox, a pool on its database and a stasher of it.
func setup(t *testing.T) (string, *sql.DB, *mysqlstasher.Stasher) {
	t.Helper()
	dataSource := mariadbtest.NewOutbox(t)
	s, err := mysqlstasher.New("outbox")
	if err != nil {
		t.Fatal(err)
	}
	return dataSource, mariadbtest.Open(t, dataSource), s
}

// readAll reads the outbox as the harvester does.
func readAll(t *testing.T, dataSource string) []driver.MarkedRecord {
	t.Helper()
	s, err := mysql.New(dataSource, "outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Dispose()
	recs, err := s.Read(context.Background(), 10000, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// What a writer stashes is what the harvester reads: topic, key and value byte for byte (NUL
// bytes and invalid UTF-8 included), a tombstone and an empty value, headers in order with
// repeated keys and characters JSON escapes, the creation time given or the database's now.
func TestStashedRecordsReadBackAsWritten(t *testing.T) {
	ctx := context.Background()
	dataSource, db, s := setup(t)
	value, empty, binary := `it's "quoted" \ with a backslash`, "", "\x00\xff\xfe bytes"
	written := []outbox.Record{
		{CreateTime: time.Now().Add(-time.Hour).Truncate(time.Microsecond), KafkaTopic: "orders", KafkaKey: "k'1", KafkaValue: &value,
			KafkaHeaders: outbox.Headers{{Key: "h", Value: "1"}, {Key: "g", Value: `"quoted"\n`}, {Key: "h", Value: "ünïcode"}}},
		{KafkaTopic: "orders", KafkaKey: binary, KafkaValue: &binary},
		{KafkaTopic: "orders.v2", KafkaKey: "", KafkaValue: nil},
		{KafkaTopic: "orders", KafkaKey: "k3", KafkaValue: &empty},
	}
	before := time.Now().Add(-time.Second)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Stash(ctx, tx, written...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, dataSource)
	if len(recs) != len(written) {
		t.Fatalf("read %d records, stashed %d", len(recs), len(written))
	}
	for i, r := range recs {
		w := written[i]
		if r.Err != nil || r.KafkaTopic != w.KafkaTopic || r.KafkaKey != w.KafkaKey {
			t.Errorf("record %d: topic %q key %q err %v; stashed topic %q key %q", i, r.KafkaTopic, r.KafkaKey, r.Err, w.KafkaTopic, w.KafkaKey)
		}
		if (r.KafkaValue == nil) != (w.KafkaValue == nil) || w.KafkaValue != nil && *r.KafkaValue != *w.KafkaValue {
			t.Errorf("record %d: value %q, stashed %q", i, deref(r.KafkaValue), deref(w.KafkaValue))
		}
		if !slices.Equal(r.KafkaHeaders, w.KafkaHeaders) && len(r.KafkaHeaders)+len(w.KafkaHeaders) > 0 {
			t.Errorf("record %d: headers %q, stashed %q", i, r.KafkaHeaders, w.KafkaHeaders)
		}
		switch {
		case !w.CreateTime.IsZero() && !r.CreateTime.Equal(w.CreateTime):
			t.Errorf("record %d: creation time %v, stashed %v", i, r.CreateTime, w.CreateTime)
		case w.CreateTime.IsZero() && (r.CreateTime.Before(before) || r.CreateTime.After(time.Now())):
			t.Errorf("record %d: creation time %v, stashed without one at about %v", i, r.CreateTime, before)
		}
	}
}

func deref(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

// A rolled-back transaction leaves no record; an invalid record is refused, by its place, before
// anything is written; more records than one statement holds are all written, in order.
func TestStashBelongsToTheTransaction(t *testing.T) {
	ctx := context.Background()
	dataSource, db, s := setup(t)
	v := "v"
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Stash(ctx, tx, outbox.Record{KafkaTopic: "t", KafkaKey: "rolled back", KafkaValue: &v}); err != nil {
		t.Fatal(err)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	bad := []outbox.Record{{KafkaTopic: "t", KafkaKey: "fine"}, {KafkaTopic: "not a topic!", KafkaKey: "bad"}}
	if err := s.Stash(ctx, db, bad...); err == nil || !strings.Contains(err.Error(), "stash record 1") {
		t.Errorf("stashing an invalid topic: %v", err)
	}
	badHeader := outbox.Record{KafkaTopic: "t", KafkaHeaders: outbox.Headers{{Key: "h", Value: "\xff"}}}
	if err := s.Stash(ctx, db, badHeader); err == nil || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("stashing a header that is not UTF-8: %v", err)
	}
	if recs := readAll(t, dataSource); len(recs) != 0 {
		t.Fatalf("%d records after a rollback and refusals", len(recs))
	}
	many := make([]outbox.Record, 2500)
	for i := range many {
		many[i] = outbox.Record{KafkaTopic: "t", KafkaKey: "k", KafkaValue: outbox.String(strings.Repeat("x", i%7))}
	}
	if err := s.Stash(ctx, db, many...); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, dataSource)
	if len(recs) != len(many) {
		t.Fatalf("read %d records, stashed %d", len(recs), len(many))
	}
	for i, r := range recs {
		if *r.KafkaValue != *many[i].KafkaValue {
			t.Fatalf("record %d: value %q, stashed %q", i, *r.KafkaValue, *many[i].KafkaValue)
		}
	}
}

// A PreStash writes records one at a time in its transaction, as Stash does.
func TestPrepareStashesInItsTransaction(t *testing.T) {
	ctx := context.Background()
	dataSource, db, s := setup(t)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	pre, err := s.Prepare(ctx, tx)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "b"} {
		if err := pre.Stash(ctx, outbox.Record{KafkaTopic: "t", KafkaKey: key}); err != nil {
			t.Fatal(err)
		}
	}
	if err := pre.Stash(ctx, outbox.Record{KafkaTopic: "", KafkaKey: "c"}); err == nil {
		t.Error("a PreStash stashed a record without a topic")
	}
	if err := pre.Close(); err != nil {
		t.Fatal(err)
	}
	if recs := readAll(t, dataSource); len(recs) != 0 {
		t.Fatalf("%d records visible before the commit", len(recs))
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	if recs := readAll(t, dataSource); len(recs) != 2 || recs[0].KafkaKey != "a" || recs[1].KafkaKey != "b" {
		t.Fatalf("after the commit: %+v", recs)
	}
}
