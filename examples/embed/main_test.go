package main

import (
	"context"
	"net/http"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/examples/internal/program"
	"github.com/goharvest/goharvest/internal/kafkacluster"
	"github.com/goharvest/goharvest/internal/leakcheck"
	"github.com/goharvest/goharvest/internal/pgtest"
	"github.com/goharvest/goharvest/internal/testwait"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(pgtest.Run(kafkacluster.Around(m)))) }

// TestEmbedPublishesAnOrder runs the program as its doc comment says, on an empty database and
// Apache Kafka, with examples/stasher taking orders on the same database: an order placed over
// HTTP arrives in Kafka with its key, value and header, once, committed; the outbox empties; and
// SIGINT stops both programs with status 0.
func TestEmbedPublishesAnOrder(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	cluster := kafkacluster.Shared(t)
	if err := cluster.CreateTopic("orders", 1); err != nil {
		t.Fatal(err)
	}

	orders := program.Start(t, program.Build(t, "github.com/goharvest/goharvest/examples/stasher"), "-dsn", dsn, "-addr", "127.0.0.1:0")
	addr := orders.Await(t, time.Minute, program.TakingOrders)[1]
	// Started once the stasher has made the tables, so that the two do not create them at once.
	embed := program.Start(t, program.Build(t, "github.com/goharvest/goharvest/examples/embed"), "-dsn", dsn, "-brokers", cluster.Addr())
	if status, body := program.Post(t, "http://"+addr+"/orders/42"); status != http.StatusCreated {
		t.Fatalf("POST /orders/42: %d %s", status, body)
	}

	got := consume(t, cluster.Addr(), "orders", 2*time.Minute)
	if got.Key != "42" || got.Value != `{"id":42,"status":"placed"}` || got.Headers != "source=order-service" {
		t.Errorf("consumed %+v, want key 42, value {\"id\":42,\"status\":\"placed\"}, header source=order-service", got)
	}
	embed.Await(t, time.Minute, regexp.MustCompile(`election event="leader acquired: `))

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var rows int
	testwait.For(t, time.Minute, "the published row to leave the outbox", func() bool {
		err = conn.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&rows)
		return err != nil || rows == 0
	})
	if err != nil {
		t.Fatal(err)
	}

	embed.Interrupt(t, time.Minute)
	orders.Interrupt(t, time.Minute)
}

// message is a record as the test reads it.
type message struct{ Key, Value, Headers string }

// consume reads topic from its start, as committed, until a record arrives, and returns it, having
// checked that no second one follows it within a few seconds.
func consume(t *testing.T, brokers, topic string, within time.Duration) message {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got []message
	// Up to within for the first record, then a few seconds for a second one, which must not come.
	for want, wait := range []time.Duration{within, 3 * time.Second} {
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		for len(got) <= want && ctx.Err() == nil {
			cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				m := message{Key: string(r.Key), Value: string(r.Value)}
				for _, h := range r.Headers {
					m.Headers += h.Key + "=" + string(h.Value)
				}
				got = append(got, m)
			})
		}
		cancel()
		if len(got) == 0 {
			t.Fatalf("no record arrived in %s within %v", topic, within)
		}
	}
	if len(got) != 1 {
		t.Errorf("%d records arrived in %s, want 1: %+v", len(got), topic, got)
	}
	return got[0]
}
