package goharvest

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/outbox"
)

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
	b, err := postgres.New(pgcluster.WithDatabase(primary.AdminDSN(), db), "outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Dispose()
	ctx := context.Background()
	holds := func() (driver.WALPosition, driver.StandbyCount) {
		t.Helper()
		exec(t, pgcluster.WithDatabase(primary.AdminDSN(), db), "INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_header_keys, kafka_header_values) VALUES (now(), 't', 'k', '{}', '{}')")
		pos, err := b.WALPosition(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var c driver.StandbyCount
		testwait.UntilEvery(3*time.Second, 5*time.Millisecond, func() bool {
			if c, err = b.Standbys(ctx, pos); err != nil {
				t.Fatal(err)
			}
			return c.Holding == 1
		})
		return pos, c
	}
	if _, c := holds(); c != (driver.StandbyCount{Holding: 1, Streaming: 1}) {
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
	if _, err := b.Standbys(ctx, driver.WALPosition{LSN: pos.LSN, Server: "another"}); !errors.Is(err, driver.ErrServerChanged) {
		t.Fatalf("a position of another server: %v, want errServerChanged", err)
	}
	onStandby, err := postgres.New(pgcluster.WithDatabase(standby.AdminDSN(), db), "outbox")
	if err != nil {
		t.Fatal(err)
	}
	defer onStandby.Dispose()
	for _, c := range []struct {
		b    *postgres.Store
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
	elector := follower()
	logs := &syncbuf.Buffer{}
	h, err := New(Config{
		LeaderGroupID:     "g",
		LeaderTopic:       "t",
		Name:              "on-standby",
		Store:             onStandby(t, standby, db),
		Limits:            Limits{HeartbeatTimeout: time.Second, MinPollInterval: 10 * time.Millisecond},
		MetricsRegisterer: prometheus.NewRegistry(),
		Logger:            slog.New(slog.NewTextHandler(logs, nil)),
		Kafka:             localKafka(elector),
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
	// More than a recheck: the harvester must still stay out.
	if !testwait.Throughout(1500*time.Millisecond, 10*time.Millisecond, func() bool { return elector.Pulses() == 0 }) {
		t.Fatalf("a harvester on a standby pulsed the election %d times", elector.Pulses())
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
		joined := elector.Pulses() > 0
		return joined && h.Ready(context.Background()) == nil
	})
	for _, want := range []string{"the database is a standby", "the database accepts writes now; joining the leader election"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, logs.String())
		}
	}
}

// onStandby is a Postgres store of the outbox in database db, through standby.
func onStandby(t *testing.T, standby *pgcluster.Server, db string) *postgres.Store {
	t.Helper()
	b, err := postgres.New(pgcluster.WithDatabase(standby.AdminDSN(), db), "outbox")
	if err != nil {
		t.Fatal(err)
	}
	return b
}
