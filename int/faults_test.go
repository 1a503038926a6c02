package int

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/goharvest/goharvest/internal/pgtest"
)

// The database fails under a running leader in three ways: its connections are killed, the
// outbox table is locked, and Postgres restarts.
func TestDatabaseFaults(t *testing.T) {
	r := newRig(t, rigOptions{})
	r.startWriters(4, 1000, 2000)
	reapers := []*reaper{r.startReaper("a"), r.startReaper("b")}
	waitLeader(t, 30*time.Second, reapers...)
	r.waitProgress(1000, 30*time.Second)
	ctx := context.Background()
	faults := 0

	for range pick(1, 3) {
		killed := r.terminateBackends(ctx)
		t.Logf("terminated %d connections", killed)
		faults++
		r.waitProgress(1000, time.Minute)

		r.lockTable(ctx, 3*time.Second)
		t.Log("held an exclusive lock on the outbox for 3s")
		faults++
		r.waitProgress(1000, time.Minute)

		if err := pgtest.Shared(t).Restart(); err != nil {
			t.Fatal(err)
		}
		t.Log("restarted Postgres")
		faults++
		r.waitProgress(1000, time.Minute)
	}
	report := r.finish(3 * time.Minute)
	figure(t, "database", "faults %d (connections killed, table locked 3s, Postgres restarted); records %d, duplicates %d, lost %d, reversals %d",
		faults, report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// terminateBackends kills every other connection to the rig's database (the reapers' and the
// writers') and returns how many.
func (r *rig) terminateBackends(ctx context.Context) int {
	r.t.Helper()
	conn, err := pgx.Connect(ctx, r.dsn)
	if err != nil {
		r.t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n)
	if err != nil {
		r.t.Fatal(err)
	}
	return n
}

// lockTable holds an exclusive lock on the outbox for d: marks, purges and inserts all wait.
func (r *rig) lockTable(ctx context.Context, d time.Duration) {
	r.t.Helper()
	conn, err := pgx.Connect(ctx, r.dsn)
	if err != nil {
		r.t.Fatal(err)
	}
	defer conn.Close(ctx)
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE"); err != nil {
			return err
		}
		time.Sleep(d) // how long the lock is held
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
}

// The broker fails under a running leader: a fraction of produce requests fail, every
// connection is dropped, and the broker stops and comes back on the same port.
func TestBrokerFaults(t *testing.T) {
	r := newRig(t, rigOptions{})
	r.startWriters(4, 1000, 2000)
	reapers := []*reaper{r.startReaper("a"), r.startReaper("b")}
	waitLeader(t, 30*time.Second, reapers...)
	r.waitProgress(1000, 30*time.Second)
	var injected int

	for range pick(1, 3) {
		failing := r.broker.FailProduce(50, kerr.UnknownServerError)
		r.waitProgress(3000, time.Minute)
		failing.Remove()
		injected += failing.Hits()
		t.Logf("failed %d produce requests (2%%)", failing.Hits())

		if err := r.broker.Restart(0); err != nil {
			t.Fatal(err)
		}
		t.Log("dropped every connection")
		injected++
		r.waitProgress(1000, time.Minute)

		if err := r.broker.Restart(3 * time.Second); err != nil {
			t.Fatal(err)
		}
		t.Log("stopped the broker for 3s and restarted it on the same port")
		injected++
		r.waitProgress(1000, time.Minute)
	}
	report := r.finish(3 * time.Minute)
	figure(t, "broker", "faults %d (failed produce requests, dropped connections, broker restarts); records %d, duplicates %d, lost %d, reversals %d",
		injected, report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}
