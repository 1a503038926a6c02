package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/mysql"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
)

// newStore returns a store on a fresh outbox, and a pool for playing writers and operators.
func newStore(t *testing.T) (*mysql.Store, *sql.DB) {
	t.Helper()
	dataSource := mariadbtest.NewOutbox(t)
	s, err := mysql.New(dataSource, "outbox")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Dispose)
	return s, mariadbtest.Open(t, dataSource)
}

func rec(key, value string) driver.OutboxRecord {
	return driver.OutboxRecord{CreateTime: time.Now(), KafkaTopic: "topic", KafkaKey: key, KafkaValue: &value}
}

func idsOf(recs []driver.MarkedRecord) []int64 {
	var ids []int64
	for _, r := range recs {
		ids = append(ids, r.ID)
	}
	return ids
}

// beginWriter opens a writer's transaction that inserts a record and stays open until the test
// commits it (or the test ends); it returns the record's id, taken at insert.
func beginWriter(t *testing.T, db *sql.DB, r driver.OutboxRecord) (int64, *sql.Tx) {
	t.Helper()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback() })
	return insert(t, tx, "outbox", r), tx
}

// A record whose transaction took a lower id and commits after a later id of another key was
// read is still claimed, from the head, before anything written after that commit; and while its
// transaction is open, claims neither wait for it nor return its row. Both claim strategies.
func TestLateCommitIsClaimedFromTheHeadWithoutWaiting(t *testing.T) {
	for _, strategy := range []string{"read", "mark"} {
		t.Run(strategy, func(t *testing.T) {
			s, db := newStore(t)
			leader := uuid.New()
			claim := func(exclude []int64) []int64 {
				t.Helper()
				// An open writer must not delay a claim: a claim that waited for its row lock
				// would run into this deadline.
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				var (
					recs []driver.MarkedRecord
					err  error
				)
				if strategy == "read" {
					recs, err = s.Read(ctx, 10, nil, exclude)
				} else {
					recs, err = s.Mark(ctx, leader, 10)
				}
				if err != nil {
					t.Fatalf("%s while a writer's transaction is open: %v", strategy, err)
				}
				return idsOf(recs)
			}
			late, writer := beginWriter(t, db, rec("k", "late"))
			other := insert(t, db, "outbox", rec("other", "1"))
			if got := claim(nil); !slices.Equal(got, []int64{other}) {
				t.Fatalf("claimed %v with record %d uncommitted; want only %d", got, late, other)
			}
			if _, err := s.Purge(context.Background(), []int64{other}); err != nil {
				t.Fatal(err)
			}
			if err := writer.Commit(); err != nil {
				t.Fatal(err)
			}
			next := insert(t, db, "outbox", rec("k", "after the late commit"))
			if got := claim(nil); !slices.Equal(got, []int64{late, next}) {
				t.Fatalf("claimed %v after the late commit; want %v, the late record first", got, []int64{late, next})
			}
		})
	}
}

// A mark waits for a row an operator has locked rather than skip it: skipping it would let its
// key's next record be claimed first.
func TestMarkWaitsForALockedRowRatherThanSkipIt(t *testing.T) {
	s, db := newStore(t)
	first := insert(t, db, "outbox", rec("k", "1"))
	second := insert(t, db, "outbox", rec("k", "2"))
	operator, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer operator.Rollback()
	if _, err := operator.Exec(`UPDATE outbox SET kafka_value = 'fixed' WHERE id = ?`, first); err != nil {
		t.Fatal(err)
	}
	type result struct {
		recs []driver.MarkedRecord
		err  error
	}
	marked := make(chan result, 1)
	go func() {
		recs, err := s.Mark(context.Background(), uuid.New(), 10)
		marked <- result{recs, err}
	}()
	select {
	case r := <-marked:
		t.Fatalf("the mark returned %v, %v while record %d was locked", idsOf(r.recs), r.err, first)
	case <-time.After(500 * time.Millisecond):
	}
	if err := operator.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-marked
	if r.err != nil {
		t.Fatal(r.err)
	}
	if got := idsOf(r.recs); !slices.Equal(got, []int64{first, second}) {
		t.Fatalf("marked %v, want %v", got, []int64{first, second})
	}
	if v := r.recs[0].KafkaValue; v == nil || *v != "fixed" {
		t.Errorf("record %d marked with value %v, want the operator's fix", first, v)
	}
}

// Held keys are compared as bytes, whatever the column's collation: holding "A" leaves "a" and
// "a " alone, which a case- and space-insensitive text kafka_key would otherwise make one key.
func TestHeldKeysAreComparedAsBytes(t *testing.T) {
	s, db := newStore(t)
	if _, err := db.Exec(`ALTER TABLE outbox MODIFY kafka_key VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL`); err != nil {
		t.Fatal(err)
	}
	ids := []int64{insert(t, db, "outbox", rec("A", "1")), insert(t, db, "outbox", rec("a", "1")), insert(t, db, "outbox", rec("a ", "1"))}
	recs, err := s.Read(context.Background(), 10, []string{"A"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := idsOf(recs); !slices.Equal(got, ids[1:]) {
		t.Errorf("read with key A held: %v, want %v", got, ids[1:])
	}
	marked, err := s.MarkExcept(context.Background(), uuid.New(), 10, []string{"A"})
	if err != nil {
		t.Fatal(err)
	}
	if got := idsOf(marked); !slices.Equal(got, ids[1:]) {
		t.Errorf("mark with key A held: %v, want %v", got, ids[1:])
	}
}

// The creation time read is the instant written, whatever the writer's and the store's
// sessions' time zones.
func TestCreateTimeIsAnInstantWhateverTheTimeZone(t *testing.T) {
	dataSource := mariadbtest.NewOutbox(t)
	db := mariadbtest.Open(t, dataSource)
	conn, err := db.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), `SET time_zone = '+05:30'`); err != nil {
		t.Fatal(err)
	}
	before := time.Now().Truncate(time.Microsecond)
	if _, err := conn.ExecContext(context.Background(), `INSERT INTO outbox (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
		VALUES ('topic', 'k', 'v', '[]', '[]')`); err != nil { // create_time: the default, NOW(6) in +05:30
		t.Fatal(err)
	}
	after := time.Now()
	sep := "?"
	if strings.Contains(dataSource, "?") {
		sep = "&"
	}
	s, err := mysql.New(dataSource+sep+"time_zone=%27-08:00%27", "outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Dispose()
	recs, err := s.Read(context.Background(), 10, nil, nil)
	if err != nil || len(recs) != 1 {
		t.Fatalf("read %d records, %v", len(recs), err)
	}
	if ct := recs[0].CreateTime; ct.Before(before) || ct.After(after) {
		t.Errorf("create_time reads as %v, written between %v and %v", ct, before, after)
	}
}

// CheckSchema accepts the table CreateOutboxTable makes, and names what is wrong with others.
func TestCheckSchema(t *testing.T) {
	s, db := newStore(t)
	ctx := context.Background()
	if err := s.CheckSchema(ctx); err != nil {
		t.Fatalf("the table CreateOutboxTable made: %v", err)
	}
	if _, err := db.Exec(`ALTER TABLE outbox DROP COLUMN kafka_header_values, MODIFY create_time DATETIME(6) NOT NULL`); err != nil {
		t.Fatal(err)
	}
	var schemaErr *driver.SchemaError
	err := s.CheckSchema(ctx)
	if !errors.As(err, &schemaErr) || len(schemaErr.Problems) != 2 ||
		!strings.Contains(err.Error(), "kafka_header_values is missing") || !strings.Contains(err.Error(), "create_time has type datetime") {
		t.Errorf("CheckSchema on a table without header values and with a DATETIME create_time: %v", err)
	}
	missing, err := mysql.NewWithDB(db, "no_such_table")
	if err != nil {
		t.Fatal(err)
	}
	if err := missing.CheckSchema(ctx); !errors.As(err, &schemaErr) || !strings.Contains(err.Error(), "no_such_table: the table does not exist") {
		t.Errorf("CheckSchema on a missing table: %v", err)
	}
}

// Backlog counts the records up to its limit and gives the oldest's creation time, zero when the
// outbox is empty.
func TestBacklog(t *testing.T) {
	s, db := newStore(t)
	ctx := context.Background()
	if n, oldest, err := s.Backlog(ctx, 10); err != nil || n != 0 || !oldest.IsZero() {
		t.Fatalf("empty outbox: Backlog = %d, %v, %v", n, oldest, err)
	}
	first := rec("a", "1")
	first.CreateTime = time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	insert(t, db, "outbox", first)
	for range 3 {
		insert(t, db, "outbox", rec("b", "1"))
	}
	if n, oldest, err := s.Backlog(ctx, 10); err != nil || n != 4 || !oldest.Equal(first.CreateTime) {
		t.Errorf("Backlog = %d, %v, %v; want 4, %v", n, oldest, err, first.CreateTime)
	}
	if n, _, err := s.Backlog(ctx, 2); err != nil || n != 2 {
		t.Errorf("Backlog up to 2 = %d, %v", n, err)
	}
}

// A table name is checked before it reaches SQL.
func TestTableNamesAreChecked(t *testing.T) {
	for _, name := range []string{"a.b.c", "out`box", "x; DROP TABLE y", ""} {
		if _, err := mysql.New("root@tcp(127.0.0.1:1)/db", name); err == nil {
			t.Errorf("New accepted the table name %q", name)
		}
		if _, err := mysql.TableDDL(name); err == nil {
			t.Errorf("TableDDL accepted the table name %q", name)
		}
	}
}

// Ping answers while the server does, and fails, naming the table, when it cannot connect.
func TestPing(t *testing.T) {
	s, _ := newStore(t)
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	down, err := mysql.New("root@tcp(127.0.0.1:1)/db?timeout=1s", "outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer down.Dispose()
	if err := down.Ping(context.Background()); err == nil || !strings.Contains(err.Error(), "outbox") {
		t.Errorf("Ping of a server that is not there: %v", err)
	}
}

// No statement of the store waits for a writer's open transaction. A purge, reset or lock by id
// that scanned the table, as the optimizer chooses when the ids are a good part of a small table
// (8 of 24 here, FORCE INDEX or not), would queue behind the writer's uncommitted row for as long
// as the writer takes; a harvester's purges stalled so (TestHarvestPublishesEveryRecordInKeyOrder).
func TestNothingWaitsForAnOpenWriter(t *testing.T) {
	s, db := newStore(t)
	open, _ := beginWriter(t, db, rec("open", "uncommitted"))
	var ids []int64
	for i := range 24 {
		ids = append(ids, insert(t, db, "outbox", rec("k"+strconv.Itoa(i%8), strconv.Itoa(i))))
	}
	versions := map[int64]string{}
	for _, r := range reread(t, s, ids[8:16]...) {
		versions[r.ID] = r.Version
	}
	leader := uuid.New()
	for _, c := range []struct {
		name string
		call func(context.Context) error
	}{
		{"Read", func(ctx context.Context) error { _, err := s.Read(ctx, 10, nil, ids[:8]); return err }},
		{"Mark", func(ctx context.Context) error { _, err := s.Mark(ctx, leader, 8); return err }},
		{"MarkExcept", func(ctx context.Context) error {
			_, err := s.MarkExcept(ctx, uuid.New(), 8, []string{"k1"})
			return err
		}},
		{"Reset", func(ctx context.Context) error { _, err := s.Reset(ctx, leader, ids[:8]); return err }},
		{"Reread", func(ctx context.Context) error { _, err := s.Reread(ctx, ids[:8]); return err }},
		{"PurgeUnchanged", func(ctx context.Context) error { _, err := s.PurgeUnchanged(ctx, versions); return err }},
		{"Purge", func(ctx context.Context) error { _, err := s.Purge(ctx, ids[16:24]); return err }},
		{"Purge of gone ids", func(ctx context.Context) error { _, err := s.Purge(ctx, ids[8:24]); return err }},
		{"DeadLetter", func(ctx context.Context) error {
			_, err := s.DeadLetter(ctx, ids[0], "", driver.DeadLetterInfo{Err: "x", FirstFailure: time.Now(), LastFailure: time.Now()})
			return err
		}},
		{"Backlog", func(ctx context.Context) error { _, _, err := s.Backlog(ctx, 100); return err }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := c.call(ctx); err != nil {
			t.Errorf("%s while record %d is uncommitted: %v", c.name, open, err)
		}
		cancel()
	}
}

func reread(t *testing.T, s *mysql.Store, ids ...int64) []driver.RereadRecord {
	t.Helper()
	recs, err := s.Reread(context.Background(), ids)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}
