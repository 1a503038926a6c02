package stasher_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	_ "github.com/lib/pq"              // registers the "postgres" database/sql driver

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/stasher"
)

// TestMain gives the example's setting (dataSource, declared in example_test.go) an empty
// database, which the example makes its tables in.
func TestMain(m *testing.M) {
	os.Exit(leakcheck.After(pgtest.RunWithDatabase(m, func(dsn string) error {
		dataSource = dsn
		return nil
	})))
}

// readBack marks everything in the outbox and returns it in id order.
func readBack(t *testing.T, dsn string) []goharvest.OutboxRecord {
	t.Helper()
	b, err := postgres.New(dsn, "outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Dispose()
	marked, err := b.Mark(context.Background(), uuid.New(), 100_000)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]goharvest.OutboxRecord, len(marked))
	for i, m := range marked {
		if m.Err != nil {
			t.Fatal(m.Err)
		}
		out[i] = m.OutboxRecord
	}
	return out
}

var sample = []goharvest.OutboxRecord{
	{KafkaTopic: "orders", KafkaKey: "1", KafkaValue: nil},
	{KafkaTopic: "orders", KafkaKey: "1", KafkaValue: goharvest.String("")},
	{KafkaTopic: "orders.v2", KafkaKey: "ключ", KafkaValue: goharvest.String("value, with {braces} and \"quotes\""),
		KafkaHeaders: goharvest.KafkaHeaders{{Key: "a", Value: `back\slash`}, {Key: "NULL", Value: ""}, {Key: "a", Value: "again"}}},
}

func sameRecords(t *testing.T, got, want []goharvest.OutboxRecord) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d records, want %d", len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		sameValue := (g.KafkaValue == nil) == (w.KafkaValue == nil) && (g.KafkaValue == nil || *g.KafkaValue == *w.KafkaValue)
		if g.KafkaTopic != w.KafkaTopic || g.KafkaKey != w.KafkaKey || !sameValue ||
			len(g.KafkaHeaders) != len(w.KafkaHeaders) || (len(w.KafkaHeaders) > 0 && !slices.Equal(g.KafkaHeaders, w.KafkaHeaders)) {
			t.Errorf("record %d: got %+v (value %v), want %+v (value %v)", i, g, g.KafkaValue, w, w.KafkaValue)
		}
	}
}

func TestStashWithDatabaseSQLDrivers(t *testing.T) {
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			dsn := pgtest.NewOutbox(t)
			db, err := sql.Open(driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			st, err := stasher.New("outbox")
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Stash(ctx, tx, sample...); err != nil {
				t.Fatal(err)
			}
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			sameRecords(t, readBack(t, dsn), sample)
		})
	}
}

func TestStashWithPgxTx(t *testing.T) {
	dsn := pgtest.NewOutbox(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	st, _ := stasher.New("outbox")
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return st.StashPgx(ctx, tx, sample...) })
	if err != nil {
		t.Fatal(err)
	}
	sameRecords(t, readBack(t, dsn), sample)
}

func TestPreStash(t *testing.T) {
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			dsn := pgtest.NewOutbox(t)
			db, _ := sql.Open(driver, dsn)
			defer db.Close()
			st, _ := stasher.New("outbox")
			ctx := context.Background()
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			pre, err := st.Prepare(ctx, tx)
			if err != nil {
				t.Fatal(err)
			}
			for _, rec := range sample {
				if err := pre.Stash(ctx, rec); err != nil {
					t.Fatal(err)
				}
			}
			if err := pre.Stash(ctx, goharvest.OutboxRecord{KafkaTopic: "bad topic"}); err == nil {
				t.Fatal("PreStash accepted an invalid topic")
			}
			pre.Close()
			if err := tx.Commit(); err != nil {
				t.Fatal(err)
			}
			sameRecords(t, readBack(t, dsn), sample)
		})
	}
}

func TestStashManyRecordsKeepsOrder(t *testing.T) {
	dsn := pgtest.NewOutbox(t)
	ctx := context.Background()
	conn, _ := pgx.Connect(ctx, dsn)
	defer conn.Close(ctx)
	st, _ := stasher.New("outbox")
	// 2,500 records take three statements; their ids must follow the order given.
	const n = 2500
	recs := make([]goharvest.OutboxRecord, n)
	for i := range recs {
		recs[i] = goharvest.OutboxRecord{KafkaTopic: "t", KafkaKey: "k", KafkaValue: goharvest.String(fmt.Sprint(i))}
	}
	if err := st.StashPgx(ctx, conn, recs...); err != nil {
		t.Fatal(err)
	}
	sameRecords(t, readBack(t, dsn), recs)
}

func TestStashRolledBackLeavesNothing(t *testing.T) {
	dsn := pgtest.NewOutbox(t)
	db, _ := sql.Open("pgx", dsn)
	defer db.Close()
	st, _ := stasher.New("outbox")
	ctx := context.Background()
	tx, _ := db.BeginTx(ctx, nil)
	if err := st.Stash(ctx, tx, sample...); err != nil {
		t.Fatal(err)
	}
	tx.Rollback()
	if got := readBack(t, dsn); len(got) != 0 {
		t.Fatalf("a rolled-back stash left %d records", len(got))
	}
}

func TestStashRejectsInvalidRecordAndWritesNothing(t *testing.T) {
	dsn := pgtest.NewOutbox(t)
	db, _ := sql.Open("pgx", dsn)
	defer db.Close()
	st, _ := stasher.New("outbox")
	cases := map[string]goharvest.OutboxRecord{
		"stash record 1 (key \"k\"): kafka topic \"\" is not a valid topic name":       {KafkaKey: "k"},
		"stash record 1 (key \"k\"): kafka topic \"a/b\"":                              {KafkaTopic: "a/b", KafkaKey: "k"},
		"stash record 1 (key \"k\"): kafka topic \"..\"":                               {KafkaTopic: "..", KafkaKey: "k"},
		"stash record 1 (key \"k\\x00\"): kafka key contains a NUL byte":               {KafkaTopic: "t", KafkaKey: "k\x00"},
		"stash record 1 (key \"k\"): kafka value contains a NUL byte":                  {KafkaTopic: "t", KafkaKey: "k", KafkaValue: goharvest.String("\x00")},
		"stash record 1 (key \"k\"): header 0 contains a NUL byte":                     {KafkaTopic: "t", KafkaKey: "k", KafkaHeaders: goharvest.KafkaHeaders{{Key: "\x00"}}},
		"stash record 1 (key \"k\"): kafka topic \"" + strings.Repeat("x", 250) + "\"": {KafkaTopic: strings.Repeat("x", 250), KafkaKey: "k"},
	}
	for want, bad := range cases {
		err := st.Stash(context.Background(), db, sample[0], bad)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want an error containing %q", err, want)
		}
	}
	if got := readBack(t, dsn); len(got) != 0 {
		t.Fatalf("a rejected call wrote %d records", len(got))
	}
}

func TestNewRejectsBadTable(t *testing.T) {
	if _, err := stasher.New("x; DROP TABLE y"); err == nil || !strings.Contains(err.Error(), "stasher") {
		t.Fatalf("got %v", err)
	}
}
