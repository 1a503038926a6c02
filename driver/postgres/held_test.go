package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"github.com/goharvest/goharvest/driver/postgres"
	"slices"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	outboxpkg "github.com/goharvest/goharvest/outbox"
)

// The mark leaves held keys alone; a re-read gives each row's version, which an update changes;
// a purge of re-read rows deletes only the unchanged ones.
func TestHeldRowStatements(t *testing.T) {
	ctx := context.Background()
	o := newOutbox(t, "outbox")
	o.stash(t, records(6, func(i int) string { return fmt.Sprint("k", i%2) })...) // k0 k1 k0 k1 k0 k1
	leader := uuid.New()
	marked, err := o.binding.MarkExcept(ctx, leader, 10, []string{"k1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range marked {
		if m.KafkaKey != "k0" {
			t.Fatalf("MarkExcept marked record %d of held key %s", m.ID, m.KafkaKey)
		}
	}
	if len(marked) != 3 {
		t.Fatalf("MarkExcept marked %d rows, want the 3 of k0", len(marked))
	}
	all := ids(marked)
	rows, err := o.binding.Reread(ctx, append(all, 999_999))
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 {
		t.Fatalf("Reread returned %d rows, want 3 (the missing id left out)", len(rows))
	}
	versions := map[int64]string{}
	for _, r := range rows {
		if r.Version == "" || r.KafkaKey != "k0" {
			t.Fatalf("reread %+v", r)
		}
		versions[r.ID] = r.Version
	}
	// An operator fixes one row after it was read.
	if _, err := o.pool.Exec(ctx, "UPDATE outbox SET kafka_value = 'fixed' WHERE id = $1", all[0]); err != nil {
		t.Fatal(err)
	}
	purged, err := o.binding.PurgeUnchanged(ctx, versions)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(purged)
	if !slices.Equal(purged, all[1:]) {
		t.Fatalf("PurgeUnchanged deleted %v, want %v (not the changed row %d)", purged, all[1:], all[0])
	}
	again, err := o.binding.Reread(ctx, all[:1])
	if err != nil || len(again) != 1 || *again[0].KafkaValue != "fixed" || again[0].Version == versions[all[0]] {
		t.Fatalf("after the fix, reread %+v, %v", again, err)
	}
}

// A dead letter moves in one statement, keeps the row's columns and the failure, and can be
// requeued at the tail under a new id.
func TestDeadLetterAndRequeue(t *testing.T) {
	ctx := context.Background()
	o := newOutbox(t, "app.outbox")
	o.stash(t, goharvest.OutboxRecord{KafkaTopic: "missing-topic", KafkaKey: "k", KafkaValue: goharvest.String("v"),
		KafkaHeaders: goharvest.KafkaHeaders{{Key: "h", Value: "1"}}})
	var id int64
	if err := o.pool.QueryRow(ctx, "SELECT id FROM app.outbox").Scan(&id); err != nil {
		t.Fatal(err)
	}
	rows, err := o.binding.Reread(ctx, []int64{id})
	if err != nil || len(rows) != 1 {
		t.Fatal(rows, err)
	}
	info := driver.DeadLetterInfo{Err: "refused", Attempts: 4, FirstFailure: rows[0].CreateTime, LastFailure: rows[0].CreateTime}
	if moved, err := o.binding.DeadLetter(ctx, id, "stale-version", info); err != nil || moved {
		t.Fatalf("DeadLetter with a stale version: moved %v, %v; want nothing moved", moved, err)
	}
	if moved, err := o.binding.DeadLetter(ctx, id, rows[0].Version, info); err != nil || !moved {
		t.Fatalf("DeadLetter: moved %v, %v", moved, err)
	}
	var (
		n        int
		topic    string
		errText  string
		attempts int
	)
	o.pool.QueryRow(ctx, "SELECT count(*) FROM app.outbox").Scan(&n)
	err = o.pool.QueryRow(ctx, "SELECT kafka_topic, error, attempts FROM app.outbox_dead_letters WHERE id = $1", id).Scan(&topic, &errText, &attempts)
	if err != nil || n != 0 || topic != "missing-topic" || errText != "refused" || attempts != 4 {
		t.Fatalf("after the move: %d rows in the outbox; dead letter %q %q %d, %v", n, topic, errText, attempts, err)
	}
	o.stash(t, records(1, func(int) string { return "k" })...) // written meanwhile
	newID, err := postgres.Requeue(ctx, o.dsn, "app.outbox", id)
	if err != nil {
		t.Fatal(err)
	}
	var maxID int64
	o.pool.QueryRow(ctx, "SELECT max(id) FROM app.outbox").Scan(&maxID)
	if newID != maxID || newID <= id {
		t.Fatalf("requeued as %d; want a new id at the tail (%d)", newID, maxID)
	}
	back, err := o.binding.Reread(ctx, []int64{newID})
	if err != nil || len(back) != 1 || back[0].KafkaTopic != "missing-topic" || len(back[0].KafkaHeaders) != 1 {
		t.Fatalf("requeued row %+v, %v", back, err)
	}
	if _, err := postgres.Requeue(ctx, o.dsn, "app.outbox", id); !errors.Is(err, postgres.ErrNoSuchRecord) {
		t.Fatalf("second requeue: %v, want ErrNoSuchRecord", err)
	}
	if err := postgres.DeadLetterNow(ctx, o.dsn, "app.outbox", newID, "moved by an operator"); err != nil {
		t.Fatal(err)
	}
	if err := postgres.DeadLetterNow(ctx, o.dsn, "app.outbox", newID, "again"); !errors.Is(err, postgres.ErrNoSuchRecord) {
		t.Fatalf("moving a missing row: %v, want ErrNoSuchRecord", err)
	}
}

func TestDeadLetterTableName(t *testing.T) {
	long := "o23456789012345678901234567890123456789012345678901234567890123"
	for in, want := range map[string]string{
		"outbox":     "outbox_dead_letters",
		"app.outbox": "app.outbox_dead_letters",
		long:         long[:63-len(outboxpkg.DeadLetterSuffix)] + outboxpkg.DeadLetterSuffix,
	} {
		if got := outboxpkg.DeadLetterTable(in); got != want || len(got) > 63 && in == long {
			t.Errorf("DeadLetterTable(%q) = %q, want %q", in, got, want)
		}
	}
}

// Held keys of a bytea kafka_key are compared as bytes: backslashes, invalid UTF-8 and text that
// looks like bytea's hex input all leave the other keys alone.
func TestMarkExceptBinaryKeys(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	if err := postgres.CreateOutboxTable(ctx, dsn, "outbox", outboxpkg.TableOptions{Bytea: true}); err != nil {
		t.Fatal(err)
	}
	b, err := postgres.New(dsn, "outbox")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Dispose)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	keys := []string{`\A`, `\x41`, "A", "\xff\x01", "plain"}
	for _, k := range keys {
		if _, err := conn.Exec(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			VALUES (now(), 't', $1, NULL, '{}', '{}')`, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	held := []string{`\A`, `\x41`, "\xff\x01"}
	marked, err := b.MarkExcept(ctx, uuid.New(), 10, held)
	if err != nil {
		t.Fatalf("MarkExcept with binary held keys: %v", err)
	}
	var got []string
	for _, m := range marked {
		got = append(got, m.KafkaKey)
	}
	if want := []string{"A", "plain"}; !slices.Equal(got, want) {
		t.Fatalf("marked keys %q, want %q", got, want)
	}
}
