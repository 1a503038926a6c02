package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/examples/internal/program"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/outbox"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(pgtest.Run(kafkacluster.Around(m)))) }

// TestEmbedPublishesAnOrder runs the program as its doc comment says, on an empty database and
// Apache Kafka, with examples/stasher taking orders on the same database: an order placed over
// HTTP arrives in Kafka, committed, with its key, value and header; the outbox empties; no second
// copy follows; and SIGINT stops both programs with status 0.
func TestEmbedPublishesAnOrder(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	cluster := kafkacluster.Shared(t)
	if err := cluster.CreateTopic("orders", 1); err != nil {
		t.Fatal(err)
	}

	orders, addr := program.StartOrderService(t, "github.com/goharvest/goharvest/examples/stasher", dsn)
	// Started once the stasher has made the tables, so that the two do not create them at once.
	embed := program.Start(t, program.Build(t, "github.com/goharvest/goharvest/examples/embed"), "-dsn", dsn, "-brokers", cluster.Addr())
	if status, body := program.Post(t, "http://"+addr+"/orders/42"); status != http.StatusCreated {
		t.Fatalf("POST /orders/42: %d %s", status, body)
	}

	want := drivertest.Message{Key: []byte("42"), Value: []byte(`{"id":42,"status":"placed"}`),
		Headers: outbox.Headers{{Key: "source", Value: "order-service"}}}
	if got := kafkatest.ReadCommitted(t, cluster.Addr(), "orders", 1, 2*time.Minute); !reflect.DeepEqual(got, []drivertest.Message{want}) {
		t.Fatalf("read %s, want %s", show(got), show([]drivertest.Message{want}))
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

	// Published once: no second copy follows.
	if got := kafkatest.ReadCommitted(t, cluster.Addr(), "orders", 2, 3*time.Second); len(got) != 1 {
		t.Errorf("read %s, want the order's message once", show(got))
	}

	embed.Interrupt(t, time.Minute)
	orders.Interrupt(t, time.Minute)
}

// show prints messages as text.
func show(ms []drivertest.Message) string {
	s := fmt.Sprintf("%d messages:", len(ms))
	for _, m := range ms {
		s += fmt.Sprintf(" {key %q value %q headers %v}", m.Key, m.Value, m.Headers)
	}
	return s
}
