package goharvest

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goharvest/goharvest/internal/pgcluster"
	"github.com/goharvest/goharvest/internal/syncbuf"
	"github.com/goharvest/goharvest/internal/testwait"
	"github.com/goharvest/goharvest/outbox"
)

// standbyFakeDB is a fake database whose standbys hold what the test says: every WAL position
// asked for is new, and holding standbys hold all of them.
type standbyFakeDB struct {
	*fakeDB
	holding   atomic.Int32
	positions atomic.Int64
	server    atomic.Value // string
}

func (d *standbyFakeDB) WALPosition(context.Context) (WALPosition, error) {
	return WALPosition{LSN: strconv.FormatInt(d.positions.Add(1), 10), Server: d.server.Load().(string)}, nil
}

func (d *standbyFakeDB) Standbys(_ context.Context, pos WALPosition) (StandbyCount, error) {
	if pos.Server != d.server.Load().(string) {
		return StandbyCount{}, errServerChanged
	}
	return StandbyCount{Holding: int(d.holding.Load()), Streaming: 1}, nil
}

// harvestOn replaces the rig's harvester with one on db, with limits.
func (r *rig) harvestOn(db DatabaseBinding, limits Limits) {
	h, err := New(Config{
		LeaderGroupID:           "g",
		LeaderTopic:             "t",
		Name:                    "test",
		Limits:                  limits,
		MetricsRegisterer:       r.registry,
		Logger:                  slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		DatabaseBindingProvider: func(string, string) (DatabaseBinding, error) { return db, nil },
		KafkaProducerProvider:   r.kafka.provider,
		NeliProvider:            r.elector.provider,
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.h = h
}

// With AwaitStandbys, nothing is published while no standby holds the marks, Ready says why,
// and everything is published, in order, once one does.
func TestAwaitStandbysHoldsPublishingUntilAStandbyHolds(t *testing.T) {
	limits := fastLimits()
	limits.AwaitStandbys = 1
	r := newRig(t, limits)
	db := &standbyFakeDB{fakeDB: r.db}
	db.server.Store("primary")
	r.harvestOn(db, limits)
	ids := r.load(20, 10)
	r.start()
	r.waitFor("leadership", 5*time.Second, r.h.IsLeader)
	r.waitFor("Ready to report the wait", 5*time.Second, func() bool {
		err := r.h.Ready(context.Background())
		return err != nil && strings.Contains(err.Error(), "awaitStandbys is 1: 1 standbys stream, 0 of them have flushed")
	})
	if n := len(r.kafka.published()); n != 0 {
		t.Fatalf("%d records published while no standby held their marks", n)
	}
	db.holding.Store(1)
	r.waitEmpty(20 * time.Second)
	r.checkOrder(ids)
	r.waitFor("Ready", 5*time.Second, func() bool { return r.h.Ready(context.Background()) == nil })
	r.stop()
}

// An epoch whose statements reach another server than before (a failover the pool followed)
// ends, and its successor publishes from what the new server holds.
func TestAwaitStandbysEndsTheEpochWhenTheServerChanges(t *testing.T) {
	limits := fastLimits()
	limits.AwaitStandbys = 1
	r := newRig(t, limits)
	db := &standbyFakeDB{fakeDB: r.db}
	db.server.Store("old")
	db.holding.Store(1)
	r.harvestOn(db, limits)
	r.start()
	r.waitFor("leadership", 5*time.Second, r.h.IsLeader)
	// The epoch learns its server from its first wait, at the marker's start.
	r.waitFor("the epoch's first wait", 5*time.Second, func() bool { return db.positions.Load() > 0 })
	first := *r.h.LeaderID()
	db.server.Store("promoted")
	ids := r.load(5, 4)
	r.waitEmpty(20 * time.Second)
	r.checkOrder(ids)
	if now := r.h.LeaderID(); now == nil || *now == first {
		t.Fatalf("leader ID %v after the server changed, want a new epoch after %v", now, first)
	}
	r.stop()
}

// startPair starts a primary and a streaming standby, with a database holding an outbox.
func startPair(t *testing.T) (primary, standby *pgcluster.Server, db string) {
	t.Helper()
	primary, err := pgcluster.StartPrimary()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { primary.Stop() })
	dsn, _, err := primary.CreateDatabase()
	if err != nil {
		t.Fatal(err)
	}
	ddl, err := outbox.TableDDL("outbox")
	if err != nil {
		t.Fatal(err)
	}
	exec(t, dsn, ddl)
	standby, err = primary.StartStandby("standby1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Stop() })
	return primary, standby, pgcluster.DatabaseName(dsn)
}

func exec(t *testing.T, dsn, sql string) {
	t.Helper()
	if err := pgcluster.Exec(context.Background(), dsn, sql); err != nil {
		t.Fatal(err)
	}
}

// The binding reads a real primary's standbys: one holds each new WAL position soon after it is
// written, none while its WAL receiver is frozen, and a position of another server is refused.
func TestPostgresStandbys(t *testing.T) {
	primary, standby, db := startPair(t)
	b, err := NewPostgresBinding(pgcluster.WithDatabase(primary.AdminDSN(), db), "outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Dispose()
	ctx := context.Background()
	holds := func() (WALPosition, StandbyCount) {
		t.Helper()
		exec(t, pgcluster.WithDatabase(primary.AdminDSN(), db), "INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_header_keys, kafka_header_values) VALUES (now(), 't', 'k', '{}', '{}')")
		pos, err := b.WALPosition(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var c StandbyCount
		testwait.UntilEvery(3*time.Second, 5*time.Millisecond, func() bool {
			if c, err = b.Standbys(ctx, pos); err != nil {
				t.Fatal(err)
			}
			return c.Holding == 1
		})
		return pos, c
	}
	if _, c := holds(); c != (StandbyCount{Holding: 1, Streaming: 1}) {
		t.Fatalf("standbys %+v, want one streaming and holding the latest write", c)
	}
	thaw, err := standby.FreezeWALReceiver()
	if err != nil {
		t.Fatal(err)
	}
	if _, c := holds(); c.Holding != 0 {
		thaw()
		t.Fatalf("standbys %+v while the only one's WAL receiver was frozen, want none holding", c)
	}
	if err := thaw(); err != nil {
		t.Fatal(err)
	}
	pos, c := holds()
	if c.Holding != 1 {
		t.Fatalf("standbys %+v after the WAL receiver thawed, want one holding", c)
	}
	if _, err := b.Standbys(ctx, WALPosition{LSN: pos.LSN, Server: "another"}); err != errServerChanged {
		t.Fatalf("a position of another server: %v, want errServerChanged", err)
	}
	onStandby, err := NewPostgresBinding(pgcluster.WithDatabase(standby.AdminDSN(), db), "outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer onStandby.Dispose()
	for _, c := range []struct {
		b    *PostgresBinding
		want bool
	}{{b, false}, {onStandby, true}} {
		if got, err := c.b.InRecovery(ctx); err != nil || got != c.want {
			t.Errorf("InRecovery %v, %v; want %v", got, err, c.want)
		}
	}
}

// A harvester whose data source is a standby says so, stays out of the election (never pulses
// it) and is not ready; once the standby is promoted, it joins and is ready.
func TestHarvesterOnAStandbyJoinsOnceItIsPromoted(t *testing.T) {
	primary, standby, db := startPair(t)
	elector := &fakeElector{}
	logs := &syncbuf.Buffer{}
	h, err := New(Config{
		LeaderGroupID:     "g",
		LeaderTopic:       "t",
		Name:              "on-standby",
		DataSource:        pgcluster.WithDatabase(standby.AdminDSN(), db),
		Limits:            Limits{HeartbeatTimeout: time.Second, MinPollInterval: 10 * time.Millisecond},
		MetricsRegisterer: prometheus.NewRegistry(),
		Logger:            slog.New(slog.NewTextHandler(logs, nil)),
		NeliProvider:      elector.provider,
		KafkaProducerProvider: func(KafkaConfigMap) (KafkaProducer, error) {
			return newFakeKafka(t, newFakeDB()).provider(nil)
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { h.Stop(); h.Await() }()
	testwait.For(t, 10*time.Second, "Ready to name the standby", func() bool {
		err := h.Ready(context.Background())
		return err != nil && strings.Contains(err.Error(), "standby")
	})
	time.Sleep(1500 * time.Millisecond) // more than a recheck: the harvester must still stay out
	elector.mu.Lock()
	pulses := elector.pulses
	elector.mu.Unlock()
	if pulses != 0 {
		t.Fatalf("a harvester on a standby pulsed the election %d times", pulses)
	}
	if err := h.Healthy(); err != nil {
		t.Fatalf("Healthy while kept out of the election: %v", err)
	}
	if err := primary.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "the harvester to join the election and be ready", func() bool {
		elector.mu.Lock()
		joined := elector.pulses > 0
		elector.mu.Unlock()
		return joined && h.Ready(context.Background()) == nil
	})
	for _, want := range []string{"the database is a standby", "the database accepts writes now; joining the leader election"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	}
}
