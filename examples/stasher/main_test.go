package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/examples/internal/program"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(pgtest.Run(m))) }

// TestStasherPlacesOrders runs the program as its doc comment says, on an empty database: it
// creates its tables, an order placed over HTTP leaves the order and the outbox row of its message,
// an order placed again or a malformed one writes nothing, and SIGINT stops it with status 0.
func TestStasherPlacesOrders(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	p, addr := program.StartOrderService(t, "github.com/goharvest/goharvest/examples/stasher", dsn)
	program.PlaceOrders(t, addr)

	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var orders []string
	rows, _ := conn.Query(ctx, "SELECT id || ' ' || status FROM orders ORDER BY id")
	if orders, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
		t.Fatal(err)
	}
	if len(orders) != 1 || orders[0] != "42 placed" {
		t.Errorf("orders: %q, want [42 placed]", orders)
	}
	type message struct{ Topic, Key, Value, Headers string }
	rows, _ = conn.Query(ctx, `SELECT kafka_topic, kafka_key, kafka_value,
		array_to_string(kafka_header_keys, ',') || '=' || array_to_string(kafka_header_values, ',') FROM outbox ORDER BY id`)
	messages, err := pgx.CollectRows(rows, pgx.RowToStructByPos[message])
	if err != nil {
		t.Fatal(err)
	}
	want := message{"orders", "42", `{"id":42,"status":"placed"}`, "source=order-service"}
	if len(messages) != 1 || messages[0] != want {
		t.Errorf("outbox: %+v, want [%+v]", messages, want)
	}

	p.Interrupt(t, time.Minute)
}
