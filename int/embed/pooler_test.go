package embed_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/pgbouncer"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/stasher"
)

func slogTo(w io.Writer) *slog.Logger { return slog.New(slog.NewTextHandler(w, nil)) }

func waitLeader(t *testing.T, h *goharvest.Harvest) {
	t.Helper()
	testwait.For(t, 30*time.Second, "election", h.IsLeader)
}

// startBouncer runs PgBouncer in front of the rig's database for the test. It fails the test
// when pgbouncer is not installed: these tests must run, and .ci/run installs it.
func (r *intRig) startBouncer(mode string, settings ...string) *pgbouncer.Bouncer {
	r.t.Helper()
	b, err := pgbouncer.Start(r.dsn, mode, settings...)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { b.Stop() })
	return b
}

// gathered returns the value of a metric in registry, summed over its label values.
func gathered(t *testing.T, registry *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// The harvester's own configuration, unchanged, works behind PgBouncer in either pool mode: it
// drains a backlog in per-key order, nothing lost, without a single database error (before, it
// could not connect at all, and in transaction mode its named statements collided).
func TestHarvestBehindPgBouncer(t *testing.T) {
	for _, c := range []struct{ mode, poolSize string }{
		// A session pool gives each client a server connection of its own for as long as it is
		// connected: the harvester's pool and its listen connection must all fit.
		{pgbouncer.Session, "default_pool_size = 10"},
		// Fewer server connections than the pool has clients, so that transactions of different
		// clients share them.
		{pgbouncer.Transaction, "default_pool_size = 3"},
	} {
		mode := c.mode
		t.Run(mode, func(t *testing.T) {
			const keys, perKey = 200, 50
			r := newIntRig(t)
			b := r.startBouncer(mode, c.poolSize)
			expected := r.load(keys, perKey)
			v := r.verifier()
			registry := prometheus.NewRegistry()
			h := r.harvesterWith("harvest-pooled", goharvest.Limits{IOErrorBackoff: 50 * time.Millisecond, MarkQueryRecords: 100}, registry,
				func(c *harvestSettings) { c.DataSource = b.DSN(r.dsn) + " pool_max_conns=6" })
			r.runUntilDelivered(h, v, keys*perKey)
			if dups := checkDelivered(t, v, expected); dups != 0 {
				t.Errorf("%d duplicates in a run without faults", dups)
			}
			if n := gathered(t, registry, "goharvest_errors_total"); n != 0 {
				t.Errorf("%v errors counted; want none", n)
			}
		})
	}
}

// With polling slowed to once a minute, only a notification can publish a record within
// seconds. Through a session pool notifications work as they are; behind a transaction pooler, a
// listen data source that reaches Postgres directly brings them back. Without it, the harvester
// finds that its notifications are lost, says so once with the interval it polls at, and polls.
func TestNotificationsBehindPgBouncer(t *testing.T) {
	r := newIntRig(t)
	b := r.startBouncer(pgbouncer.Transaction)
	pooled := b.DSN(r.dsn)

	t.Run("direct listen data source", func(t *testing.T) {
		logs := &syncbuf.Buffer{}
		h := r.harvesterWith("notify-direct", goharvest.Limits{MarkBackoff: time.Minute, MaxMarkBackoff: time.Minute}, nil,
			func(c *harvestSettings) {
				// Pool settings copied along with the rest do no harm.
				c.DataSource, c.ListenDataSource = pooled, r.dsn+" pool_max_conns=2"
				c.Logger = slogTo(logs)
			})
		if err := h.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { h.Stop(); h.Await() }()
		waitLeader(t, h)
		// Past the first empty marks: the marker now sleeps a minute. Nothing signals that it has
		// started that sleep, so the test leaves it time.
		time.Sleep(500 * time.Millisecond)
		r.load(1, 1)
		r.waitEmpty(5 * time.Second)
		if strings.Contains(logs.String(), "notifications of new records unavailable") {
			t.Errorf("notifications reported unavailable through a direct connection:\n%s", logs)
		}
	})

	t.Run("session pool", func(t *testing.T) {
		session := r.startBouncer(pgbouncer.Session)
		logs := &syncbuf.Buffer{}
		h := r.harvesterWith("notify-session", goharvest.Limits{MarkBackoff: time.Minute, MaxMarkBackoff: time.Minute}, nil,
			func(c *harvestSettings) {
				c.DataSource = session.DSN(r.dsn)
				c.Logger = slogTo(logs)
			})
		if err := h.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { h.Stop(); h.Await() }()
		waitLeader(t, h)
		time.Sleep(500 * time.Millisecond) // past the first empty marks, as above
		r.load(1, 1)
		r.waitEmpty(5 * time.Second)
		if strings.Contains(logs.String(), "notifications of new records unavailable") {
			t.Errorf("notifications reported unavailable through a session pool:\n%s", logs)
		}
	})

	t.Run("listening through the pooler", func(t *testing.T) {
		logs := &syncbuf.Buffer{}
		h := r.harvesterWith("notify-pooled", goharvest.Limits{MarkBackoff: 100 * time.Millisecond, MaxMarkBackoff: 200 * time.Millisecond}, nil,
			func(c *harvestSettings) {
				c.DataSource = pooled
				c.Logger = slogTo(logs)
			})
		if err := h.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { h.Stop(); h.Await() }()
		waitLeader(t, h)
		if !testwait.Until(20*time.Second, func() bool {
			return strings.Contains(logs.String(), "notifications of new records unavailable; polling instead")
		}) {
			t.Fatalf("lost notifications never reported:\n%s", logs)
		}
		line := logs.String()
		if !strings.Contains(line, "pollInterval=200ms") || !strings.Contains(line, "transaction mode") {
			t.Errorf("the report lacks the poll interval or the likely cause:\n%s", line)
		}
		r.load(1, 1) // found by polling
		r.waitEmpty(5 * time.Second)
		if n := strings.Count(logs.String(), "notifications of new records unavailable"); n != 1 {
			t.Errorf("reported %d times; want once", n)
		}
	})
}

// While PgBouncer is paused (a pooler stall: every statement waits, then fails after
// query_wait_timeout), an elected leader with records to publish cannot, and Ready says so. With the mark
// strategy goharvest_leader reads 0 meanwhile, since a failed mark ends the epoch; with read (the
// default) the epoch goes on reading and it reads 1. After RESUME both recover and the records
// written meanwhile are published in order, none lost.
func TestReadinessDuringPoolerStall(t *testing.T) {
	r := newIntRig(t)
	b := r.startBouncer(pgbouncer.Transaction, "query_wait_timeout = 1")
	expected := r.load(20, 5)
	v := r.verifier()
	registry := prometheus.NewRegistry()
	h := r.harvesterWith("stall", goharvest.Limits{IOErrorBackoff: 100 * time.Millisecond}, registry,
		func(c *harvestSettings) { c.DataSource, c.ListenDataSource = b.DSN(r.dsn), r.dsn })
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { h.Stop(); h.Await() }()
	r.waitEmpty(30 * time.Second)
	ready := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return h.Ready(ctx)
	}
	if err := ready(); err != nil {
		t.Fatalf("not ready while publishing: %v", err)
	}

	ctx := context.Background()
	if err := b.Admin(ctx, "PAUSE"); err != nil {
		t.Fatal(err)
	}
	paused := true
	defer func() {
		if paused {
			b.Admin(ctx, "RESUME")
		}
	}()
	// Five more records per key, written directly while the pooler stalls: their notifications wake
	// the leader, whose reads through the pooler fail. (An idle leader whose notifications cover
	// every write reads nothing, and only the database's ping fails meanwhile.)
	var more []goharvest.OutboxRecord
	for seq := int64(5); seq < 10; seq++ {
		for k := range expected {
			more = append(more, verify.Record(r.topic, k, r.run, seq, goharvest.String("payload")))
		}
	}
	st, _ := stasher.New("outbox")
	if err := st.StashPgx(ctx, r.pool, more...); err != nil {
		t.Fatal(err)
	}
	for k := range expected {
		expected[k] = 10
	}
	var err error
	deadline := time.Now().Add(30 * time.Second)
	for err = ready(); err == nil || !strings.Contains(err.Error(), "cannot publish"); err = ready() {
		if time.Now().After(deadline) {
			t.Fatalf("Ready during the stall: %v; want it to say the leader cannot publish", err)
		}
	}
	t.Logf("Ready during the stall: %v", err)
	if g := gathered(t, registry, "goharvest_leader"); g != 1 {
		t.Errorf("goharvest_leader = %v while reads fail; a read that fails ends no epoch", g)
	}

	if err := b.Admin(ctx, "RESUME"); err != nil {
		t.Fatal(err)
	}
	paused = false
	r.waitEmpty(30 * time.Second)
	if !testwait.Until(30*time.Second, func() bool { err = ready(); return err == nil && gathered(t, registry, "goharvest_leader") == 1 }) {
		t.Fatalf("after RESUME: Ready %v, goharvest_leader %v", err, gathered(t, registry, "goharvest_leader"))
	}
	v.WaitDistinct(t, 200, time.Minute)
	checkDelivered(t, v, expected)
}
