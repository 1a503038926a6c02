package int

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
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

// Brokers of a 3-node cluster fail under a running leader and its standby: the broker that
// coordinates the harvester's transactions is killed (SIGKILL) and restarted, then the one that
// coordinates the leader group, then a broker freezes (SIGSTOP) for longer than
// broker.session.timeout.ms (9s), so that the cluster takes its partitions away while its
// connections stay open, and resumes. Under make chaos, a rolling restart (SIGTERM, a controlled
// shutdown) of all three follows.
func TestBrokerFaults(t *testing.T) {
	brokerFaults(t, "brokers fail", rigOptions{}, pick(1, 3))
}

func brokerFaults(t *testing.T, scenario string, o rigOptions, rounds int) {
	o.kafka = faultedKafka
	r := newRig(t, o)
	r.startWriters(4, 1000, 2000)
	reapers := []*reaper{r.startReaper("a"), r.startReaper("b")}
	waitLeader(t, 30*time.Second, reapers...)
	r.waitProgress(1000, 30*time.Second)
	var faults []string
	var outages []time.Duration

	// fault runs one fault and measures how long publishing stalled: from the fault to the first
	// 200 records published after it.
	fault := func(name string, do func()) {
		t.Helper()
		t0 := time.Now()
		do()
		r.waitProgress(200, 2*time.Minute)
		outages = append(outages, time.Since(t0))
		faults = append(faults, name)
		t.Logf("%s: publishing again %v after the fault began", name, time.Since(t0).Round(time.Millisecond))
		r.waitProgress(1000, time.Minute)
	}
	restart := func(n *kafkacluster.Node) {
		t.Helper()
		if err := n.Start(); err != nil {
			t.Fatal(err)
		}
		if err := r.kafka.WaitReady(2 * time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	for range rounds {
		txn, err := r.kafka.Coordinator(kafkacluster.TransactionCoordinator, goharvest.TransactionalID(r.group, 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		fault(fmt.Sprintf("transaction coordinator (node %d) killed", txn.ID), txn.Kill)
		restart(txn)

		group, err := r.kafka.Coordinator(kafkacluster.GroupCoordinator, r.group)
		if err != nil {
			t.Fatal(err)
		}
		fault(fmt.Sprintf("group coordinator (node %d) killed", group.ID), group.Kill)
		restart(group)

		frozen := r.kafka.Nodes()[0]
		fault("node 1 frozen for 12s", func() {
			frozen.Freeze()
			time.Sleep(12 * time.Second)
			frozen.Thaw()
		})
		if err := r.kafka.WaitReady(2 * time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if long() {
		for _, n := range r.kafka.Nodes() {
			fault(fmt.Sprintf("rolling restart: node %d", n.ID), func() {
				n.Terminate(time.Minute)
				restart(n)
			})
		}
	}
	report := r.finish(3 * time.Minute)
	figure(t, scenario, "3 nodes; %s; publishing again after %s; records %d, duplicates %d, lost %d, reversals %d",
		strings.Join(faults, ", "), spread(outages), report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// A running leader's produce requests fail (1 in 50, an error the harvester sees), the broker
// drops every connection, and it stops and comes back on the same port. kfake only: a real broker
// fails no chosen request; the real cluster's broker failures are TestBrokerFaults.
func TestProduceRequestsFail(t *testing.T) {
	r := newRig(t, rigOptions{kafka: kfakeOnly})
	r.startWriters(4, 1000, 2000)
	reapers := []*reaper{r.startReaper("a"), r.startReaper("b")}
	waitLeader(t, 30*time.Second, reapers...)
	r.waitProgress(1000, 30*time.Second)
	var injected int

	for range pick(1, 3) {
		failing := r.fake.FailProduce(50, kerr.UnknownServerError)
		r.waitProgress(3000, time.Minute)
		failing.Remove()
		injected += failing.Hits()
		t.Logf("failed %d produce requests (2%%)", failing.Hits())

		if err := r.fake.Restart(0); err != nil {
			t.Fatal(err)
		}
		t.Log("dropped every connection")
		injected++
		r.waitProgress(1000, time.Minute)

		if err := r.fake.Restart(3 * time.Second); err != nil {
			t.Fatal(err)
		}
		t.Log("stopped the broker for 3s and restarted it on the same port")
		injected++
		r.waitProgress(1000, time.Minute)
	}
	report := r.finish(3 * time.Minute)
	figure(t, "kfake: produce requests fail", "faults %d (failed produce requests, dropped connections, broker restarts); records %d, duplicates %d, lost %d, reversals %d",
		injected, report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}
