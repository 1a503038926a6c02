package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/goharvest/goharvest/driver/postgres"
	outboxpkg "github.com/goharvest/goharvest/outbox"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/stasher"
)

// outbox gives a test a fresh database with an outbox table, a binding to it and a pool for
// writing rows directly.
type outbox struct {
	dsn     string
	binding *postgres.Store
	pool    *pgxpool.Pool
	stasher *stasher.Stasher
}

func newOutbox(t *testing.T, table string) *outbox {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	if schema, _, ok := strings.Cut(table, "."); ok {
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, "CREATE SCHEMA "+schema)
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := postgres.CreateOutboxTable(ctx, dsn, table, outboxpkg.TableOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := postgres.New(dsn, table)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	st, err := stasher.New(table)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Dispose(); pool.Close() })
	return &outbox{dsn: dsn, binding: b, pool: pool, stasher: st}
}

func (o *outbox) stash(t *testing.T, records ...goharvest.OutboxRecord) {
	t.Helper()
	if err := o.stasher.StashPgx(context.Background(), o.pool, records...); err != nil {
		t.Fatal(err)
	}
}

func (o *outbox) count(t *testing.T, where string) int {
	t.Helper()
	var n int
	if err := o.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func records(n int, key func(i int) string) []goharvest.OutboxRecord {
	recs := make([]goharvest.OutboxRecord, n)
	for i := range recs {
		recs[i] = goharvest.OutboxRecord{KafkaTopic: "t", KafkaKey: key(i), KafkaValue: goharvest.String(fmt.Sprint(i))}
	}
	return recs
}

func ids(marked []driver.MarkedRecord) []int64 {
	out := make([]int64, len(marked))
	for i, m := range marked {
		out[i] = m.ID
	}
	return out
}

func mark(t *testing.T, o *outbox, leader uuid.UUID, limit int) []driver.MarkedRecord {
	t.Helper()
	marked, err := o.binding.Mark(context.Background(), leader, limit)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range marked {
		if m.Err != nil {
			t.Fatalf("record %d: %v", m.ID, m.Err)
		}
		if m.LeaderID == nil || *m.LeaderID != leader {
			t.Fatalf("record %d came back with leader %v, want %v", m.ID, m.LeaderID, leader)
		}
	}
	return marked
}

func TestMarkReturnsOldestInIDOrderAndSkipsOwnMarks(t *testing.T) {
	o := newOutbox(t, "outbox")
	o.stash(t, records(25, func(i int) string { return fmt.Sprint(i % 3) })...)
	leader := uuid.New()

	first := mark(t, o, leader, 10)
	second := mark(t, o, leader, 10)
	third := mark(t, o, leader, 10)
	fourth := mark(t, o, leader, 10)

	all := slices.Concat(ids(first), ids(second), ids(third))
	if len(first) != 10 || len(second) != 10 || len(third) != 5 || len(fourth) != 0 {
		t.Fatalf("batch sizes %d %d %d %d, want 10 10 5 0", len(first), len(second), len(third), len(fourth))
	}
	if !slices.IsSorted(all) || len(slices.Compact(slices.Clone(all))) != 25 {
		t.Fatalf("marks returned %v, want 25 distinct ids in ascending order", all)
	}
	var firstID int64
	o.pool.QueryRow(context.Background(), "SELECT min(id) FROM outbox").Scan(&firstID)
	if all[0] != firstID {
		t.Fatalf("the first mark began at %d, not at the head of the table (%d)", all[0], firstID)
	}
}

func TestMarkByNewLeaderTakesOverOldLeadersRows(t *testing.T) {
	o := newOutbox(t, "outbox")
	o.stash(t, records(6, func(i int) string { return "k" })...)
	old := uuid.New()
	oldMarked := mark(t, o, old, 4)

	successor := uuid.New()
	taken := mark(t, o, successor, 100)
	if len(taken) != 6 || taken[0].ID != oldMarked[0].ID {
		t.Fatalf("the new leader marked %v, want all 6 rows from the head", ids(taken))
	}
	if n := o.count(t, fmt.Sprintf("leader_id = '%s'", successor)); n != 6 {
		t.Fatalf("%d rows carry the new leader's ID, want 6", n)
	}
}

func TestPurgeAndResetTenThousandIDsInOneCallEach(t *testing.T) {
	o := newOutbox(t, "outbox")
	const n = 20_000
	o.stash(t, records(n, func(i int) string { return fmt.Sprint(i) })...)
	leader := uuid.New()
	marked := mark(t, o, leader, n)
	purge, reset := ids(marked[:10_000]), ids(marked[10_000:])

	ctx := context.Background()
	purged, err := o.binding.Purge(ctx, purge)
	if err != nil || purged != 10_000 {
		t.Fatalf("purged %d, %v; want 10000", purged, err)
	}
	// A reset by a leader that no longer holds the rows must leave them alone.
	if cleared, err := o.binding.Reset(ctx, uuid.New(), reset); err != nil || cleared != 0 {
		t.Fatalf("a stale leader reset %d rows (%v); want 0", cleared, err)
	}
	cleared, err := o.binding.Reset(ctx, leader, reset)
	if err != nil || cleared != 10_000 {
		t.Fatalf("reset %d, %v; want 10000", cleared, err)
	}
	if left := o.count(t, "true"); left != 10_000 {
		t.Fatalf("%d rows left, want 10000", left)
	}
	if unmarked := o.count(t, "leader_id IS NULL"); unmarked != 10_000 {
		t.Fatalf("%d rows unmarked, want 10000", unmarked)
	}
	// Purging ids that are gone already is not an error.
	if again, err := o.binding.Purge(ctx, purge); err != nil || again != 0 {
		t.Fatalf("second purge: %d, %v", again, err)
	}
	// The reset rows are marked again, from the head.
	if again := mark(t, o, leader, n); !slices.Equal(ids(again), reset) {
		t.Fatalf("after reset the mark returned %d rows, want the %d reset ones", len(again), len(reset))
	}
}

func TestMarkSkipsNothingWhileEightWritersStash(t *testing.T) {
	o := newOutbox(t, "outbox")
	ctx := context.Background()
	const writers, perWriter = 8, 400
	leader := uuid.New()

	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter / 4 {
				// Several records per transaction, as applications write them.
				recs := records(4, func(j int) string { return fmt.Sprintf("w%d-%d", w, i*4+j) })
				if err := pgx.BeginFunc(ctx, o.pool, func(tx pgx.Tx) error {
					return o.stasher.StashPgx(ctx, tx, recs...)
				}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	writersDone := make(chan struct{})
	go func() { wg.Wait(); close(writersDone) }()

	seen := map[int64]int{}
	for finished := false; ; {
		select {
		case <-writersDone:
			finished = true
		default:
		}
		batch := mark(t, o, leader, 50)
		for _, id := range ids(batch) {
			seen[id]++
		}
		// Only an empty mark that began after the writers finished proves nothing is left.
		if finished && len(batch) == 0 {
			break
		}
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != writers*perWriter {
		t.Fatalf("marked %d distinct rows, want %d", len(seen), writers*perWriter)
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("row %d was marked %d times by one leader", id, n)
		}
	}
	if unmarked := o.count(t, "leader_id IS NULL"); unmarked != 0 {
		t.Fatalf("%d rows were never marked", unmarked)
	}
}

// A transaction that took a lower id but commits after one with a higher id must still be
// marked: the harvester reads from the head of the table rather than from an offset.
func TestMarkReturnsLateCommittedLowerID(t *testing.T) {
	o := newOutbox(t, "outbox")
	ctx := context.Background()
	leader := uuid.New()

	early, err := o.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer early.Rollback(ctx)
	if err := o.stasher.StashPgx(ctx, early, records(1, func(int) string { return "early" })...); err != nil {
		t.Fatal(err)
	}
	o.stash(t, records(1, func(int) string { return "late" })...)

	got := mark(t, o, leader, 10)
	if len(got) != 1 || got[0].KafkaKey != "late" {
		t.Fatalf("first mark returned %v, want only the committed record", got)
	}
	if err := early.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got = mark(t, o, leader, 10)
	if len(got) != 1 || got[0].KafkaKey != "early" || got[0].ID >= ids(mark(t, o, uuid.New(), 10))[1] {
		t.Fatalf("after the late commit the mark returned %v, want the early record with the lower id", got)
	}
}

func TestRecordsRoundTripExactly(t *testing.T) {
	for _, table := range []string{"outbox", "app.outbox"} {
		t.Run(table, func(t *testing.T) {
			o := newOutbox(t, table)
			created := time.Date(2024, 2, 29, 23, 59, 58, 123456000, time.UTC)
			want := []goharvest.OutboxRecord{
				{KafkaTopic: "t.one", KafkaKey: "tombstone", KafkaValue: nil, KafkaHeaders: goharvest.KafkaHeaders{}},
				{KafkaTopic: "t_two", KafkaKey: "empty", KafkaValue: goharvest.String(""), KafkaHeaders: goharvest.KafkaHeaders{}},
				{KafkaTopic: "t-3", KafkaKey: "héllo 世界", KafkaValue: goharvest.String(`{"a": [1, "b\"c"]}`), CreateTime: created,
					KafkaHeaders: goharvest.KafkaHeaders{
						{Key: "traceparent", Value: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
						{Key: "dup", Value: "1"}, {Key: "dup", Value: "2"},
						{Key: "", Value: ""},
						{Key: `quote"back\slash`, Value: "{brace},comma"},
						{Key: "NULL", Value: "null"},
					}},
			}
			o.stash(t, want...)
			got := mark(t, o, uuid.New(), 10)
			if len(got) != len(want) {
				t.Fatalf("got %d records, want %d", len(got), len(want))
			}
			for i := range want {
				g := got[i].OutboxRecord
				if g.KafkaTopic != want[i].KafkaTopic || g.KafkaKey != want[i].KafkaKey || !slices.Equal(g.KafkaHeaders, want[i].KafkaHeaders) {
					t.Errorf("record %d: got %+v, want %+v", i, g, want[i])
				}
				if (g.KafkaValue == nil) != (want[i].KafkaValue == nil) || (g.KafkaValue != nil && *g.KafkaValue != *want[i].KafkaValue) {
					t.Errorf("record %d: value %v, want %v", i, g.KafkaValue, want[i].KafkaValue)
				}
				if g.CreateTime.IsZero() {
					t.Errorf("record %d: no create time", i)
				}
			}
			if !got[2].CreateTime.Equal(created) {
				t.Errorf("create time %v, want %v", got[2].CreateTime, created)
			}
		})
	}
}

func TestMalformedRowsAreReportedByIDWithoutFailingTheBatch(t *testing.T) {
	o := newOutbox(t, "outbox")
	ctx := context.Background()
	o.stash(t, records(1, func(int) string { return "good-before" })...)
	var mismatched, nullHeader, twoDim int64
	insert := func(keys, values string) int64 {
		var id int64
		err := o.pool.QueryRow(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			VALUES (now(), 't', 'bad', 'v', `+keys+`, `+values+`) RETURNING id`).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	mismatched = insert(`'{a,b}'`, `'{x}'`)
	nullHeader = insert(`ARRAY['a', NULL]`, `'{x,y}'`)
	twoDim = insert(`'{{a,b},{c,d}}'`, `'{{w,x},{y,z}}'`)
	o.stash(t, records(1, func(int) string { return "good-after" })...)

	marked, err := o.binding.Mark(ctx, uuid.New(), 10)
	if err != nil {
		t.Fatalf("one malformed row failed the whole mark: %v", err)
	}
	if len(marked) != 5 {
		t.Fatalf("marked %d rows, want all 5 (malformed ones included)", len(marked))
	}
	wantErr := map[int64]string{
		mismatched: "kafka_header_keys has 2 elements but kafka_header_values has 1",
		nullHeader: "header 1 has a NULL key or value",
		twoDim:     "one-dimensional",
	}
	for _, m := range marked {
		want, bad := wantErr[m.ID]
		if !bad {
			if m.Err != nil {
				t.Errorf("good record %d reported %v", m.ID, m.Err)
			}
			continue
		}
		var re *driver.RecordError
		if !errors.As(m.Err, &re) || re.ID != m.ID || !strings.Contains(m.Err.Error(), want) ||
			!strings.Contains(m.Err.Error(), fmt.Sprintf("outbox record %d", m.ID)) {
			t.Errorf("record %d: error %v, want a RecordError naming it and containing %q", m.ID, m.Err, want)
		}
	}
}

func TestMarkReportsMissingTable(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	b, err := postgres.New(dsn, "no_such_table")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Dispose()
	_, err = b.Mark(context.Background(), uuid.New(), 10)
	if err == nil || !strings.Contains(err.Error(), "mark outbox") || !strings.Contains(err.Error(), "no_such_table") {
		t.Fatalf("got %v, want a mark error naming the table", err)
	}
}

func TestNewPostgresBindingRejectsBadTableName(t *testing.T) {
	_, err := postgres.New("host=localhost", "outbox; DROP TABLE x")
	if err == nil || !strings.Contains(err.Error(), "not allowed") {
		t.Fatalf("got %v", err)
	}
	if _, err := outboxpkg.TableDDL("a.b.c"); err == nil {
		t.Fatal("OutboxTableDDL accepted a.b.c")
	}
}

func TestCreateOutboxTableIsIdempotent(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	for range 2 {
		if err := postgres.CreateOutboxTable(ctx, dsn, "outbox", outboxpkg.TableOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCheckSchema(t *testing.T) {
	ctx := context.Background()
	o := newOutbox(t, "outbox")
	if err := o.binding.CheckSchema(ctx); err != nil {
		t.Fatalf("the standard table was rejected: %v", err)
	}
	// Every payload type the harvester reads is accepted.
	for _, alter := range []string{
		`ALTER TABLE outbox ALTER COLUMN kafka_value TYPE jsonb USING to_jsonb(kafka_value)`,
		`ALTER TABLE outbox ALTER COLUMN kafka_value TYPE json USING kafka_value::json`,
		`ALTER TABLE outbox ALTER COLUMN kafka_value TYPE bytea USING kafka_value::text::bytea,
			ALTER COLUMN kafka_key TYPE bytea USING kafka_key::bytea,
			ALTER COLUMN kafka_header_values TYPE bytea[] USING '{}'`,
	} {
		if _, err := o.pool.Exec(ctx, alter); err != nil {
			t.Fatal(err)
		}
		if err := o.binding.CheckSchema(ctx); err != nil {
			t.Fatalf("after %s: %v", alter, err)
		}
	}
	if _, err := o.pool.Exec(ctx, `ALTER TABLE outbox ALTER COLUMN kafka_value TYPE xml USING NULL,
		DROP COLUMN leader_id`); err != nil {
		t.Fatal(err)
	}
	err := o.binding.CheckSchema(ctx)
	var schemaErr *driver.SchemaError
	if !errors.As(err, &schemaErr) || len(schemaErr.Problems) != 2 ||
		!strings.Contains(err.Error(), "column kafka_value has type xml; goharvest reads it as text or character varying or character or bytea or json or jsonb") ||
		!strings.Contains(err.Error(), "column leader_id is missing") {
		t.Fatalf("got %v, want a SchemaError naming kafka_value's type and the missing leader_id", err)
	}

	missing, err := postgres.New(o.dsn, "no_such_table")
	if err != nil {
		t.Fatal(err)
	}
	defer missing.Dispose()
	if err := missing.CheckSchema(ctx); err == nil || errors.As(err, &schemaErr) || !strings.Contains(err.Error(), "no_such_table") {
		t.Fatalf("a missing table gave %v", err)
	}
}

func TestBacklogAndPing(t *testing.T) {
	ctx := context.Background()
	o := newOutbox(t, "outbox")
	if err := o.binding.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if n, oldest, err := o.binding.Backlog(ctx, 100); err != nil || n != 0 || !oldest.IsZero() {
		t.Fatalf("empty outbox: %d, %v, %v", n, oldest, err)
	}
	created := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	first := records(1, func(int) string { return "k" })
	first[0].CreateTime = created
	o.stash(t, first...)
	o.stash(t, records(200, func(i int) string { return fmt.Sprint(i) })...)
	n, oldest, err := o.binding.Backlog(ctx, 150)
	if err != nil || n != 150 || !oldest.Equal(created) {
		t.Fatalf("backlog %d (want 150, capped), oldest %v (want %v), %v", n, oldest, created, err)
	}
}

// TestListenWakesOnCommit checks the binding's notifications for a plain and a schema-qualified
// table: a wake once listening, one when a writer's transaction commits, and none before.
func TestListenWakesOnCommit(t *testing.T) {
	for _, table := range []string{"outbox", "app.outbox"} {
		t.Run(table, func(t *testing.T) {
			o := newOutbox(t, table)
			ctx, cancel := context.WithCancel(context.Background())
			wakes := make(chan struct{}, 10)
			done := make(chan error, 1)
			go func() { done <- o.binding.Listen(ctx, func() { wakes <- struct{}{} }) }()
			expectWake := func(what string) {
				t.Helper()
				select {
				case <-wakes:
				case <-time.After(5 * time.Second):
					t.Fatalf("no wake %s", what)
				}
			}
			expectWake("once listening")

			tx, err := o.pool.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := o.stasher.StashPgx(ctx, tx, goharvest.OutboxRecord{KafkaTopic: "t", KafkaKey: "k"}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-wakes:
				t.Fatal("woken before the writer committed")
			case <-time.After(200 * time.Millisecond):
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			expectWake("after the commit")

			cancel()
			if err := <-done; err != nil {
				t.Fatalf("Listen returned %v after its context ended; want nil", err)
			}
		})
	}
}

// ListenCovering says its wake-ups cover every write while the table has its notification
// trigger, and stops saying so within a check (10s) of the trigger's going, and again when it is
// back, so that the harvester polls exactly while a write could go unheard.
func TestListenCoversWritesWhileTheTriggerIsThere(t *testing.T) {
	o := newOutbox(t, "app.outbox")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	covered := make(chan bool, 10)
	done := make(chan error, 1)
	go func() {
		done <- o.binding.ListenCovering(ctx, func() {}, func(c bool) { covered <- c })
	}()
	expect := func(want bool, within time.Duration, what string) {
		t.Helper()
		deadline := time.After(within)
		for {
			select {
			case c := <-covered:
				if c == want {
					return
				}
			case <-deadline:
				t.Fatalf("not covered=%v within %v %s", want, within, what)
			}
		}
	}
	expect(true, 5*time.Second, "once listening")
	if _, err := o.pool.Exec(ctx, "DROP TRIGGER goharvest_notify ON app.outbox"); err != nil {
		t.Fatal(err)
	}
	expect(false, 20*time.Second, "after the trigger was dropped")
	if err := postgres.CreateOutboxTable(ctx, o.dsn, "app.outbox", outboxpkg.TableOptions{}); err != nil { // the trigger again
		t.Fatal(err)
	}
	expect(true, 20*time.Second, "after the trigger came back")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("ListenCovering returned %v after its context ended; want nil", err)
	}
	expect(false, time.Second, "once it returned")
}

// Each shard's view marks exactly the rows whose keys outbox.Shard puts in it, oldest first:
// the Go function and the SQL expression agree, and together the shards cover the outbox.
func TestShardViewsMarkOnlyTheirRows(t *testing.T) {
	const shards = 8
	o := newOutbox(t, "outbox")
	o.stash(t, records(2000, func(i int) string { return fmt.Sprintf("key-%d-ü", i%300) })...)
	var all []int64
	for s := range shards {
		view := o.binding.Shard(s, shards)
		marked, err := view.Mark(context.Background(), uuid.New(), 5000)
		if err != nil {
			t.Fatal(err)
		}
		if len(marked) == 0 {
			t.Errorf("shard %d marked nothing", s)
		}
		for i, m := range marked {
			if got := outboxpkg.Shard([]byte(m.KafkaKey), shards); got != s {
				t.Fatalf("shard %d marked record %d of key %q, which outbox.Shard puts in shard %d", s, m.ID, m.KafkaKey, got)
			}
			if i > 0 && marked[i-1].ID > m.ID {
				t.Fatalf("shard %d marked out of id order", s)
			}
			all = append(all, m.ID)
		}
		view.Dispose() // a view's Dispose leaves the binding open
	}
	slices.Sort(all)
	if len(all) != 2000 || len(slices.Compact(all)) != 2000 {
		t.Fatalf("the shards marked %d records between them, want each of the 2000 once", len(all))
	}
	if _, err := o.binding.Mark(context.Background(), uuid.New(), 1); err != nil {
		t.Fatalf("the binding no longer works after its views were disposed: %v", err)
	}
}
