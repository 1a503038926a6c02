package main

import (
	"database/sql"
	"net/http"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/goharvest/goharvest/examples/internal/program"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(mariadbtest.Run(m))) }

// TestMySQLStasherPlacesOrders runs the program as its doc comment says, on an empty MariaDB
// database: it creates its tables, an order placed over HTTP leaves the order and the outbox row
// of its message, an order placed again or a malformed one writes nothing, an order whose message
// cannot be written leaves no order either, and SIGINT stops it with status 0.
func TestMySQLStasherPlacesOrders(t *testing.T) {
	dsn := mariadbtest.NewDatabase(t)
	p, addr := program.StartOrderService(t, "github.com/goharvest/goharvest/examples/mysqlstasher", dsn)
	program.PlaceOrders(t, addr)

	db := mariadbtest.Open(t, dsn)
	wantOrders := []string{"42 placed"}
	if got := placedOrders(t, db); !slices.Equal(got, wantOrders) {
		t.Errorf("orders: %q, want %q", got, wantOrders)
	}
	type message struct{ Topic, Key, Value, HeaderKeys, HeaderValues string }
	rows, err := db.Query(`SELECT kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values
		FROM outbox WHERE leader_id IS NULL ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var messages []message
	for rows.Next() {
		var m message
		if err := rows.Scan(&m.Topic, &m.Key, &m.Value, &m.HeaderKeys, &m.HeaderValues); err != nil {
			t.Fatal(err)
		}
		messages = append(messages, m)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := message{"orders", "42", `{"id":42,"status":"placed"}`, `["source"]`, `["order-service"]`}
	if len(messages) != 1 || messages[0] != want {
		t.Errorf("outbox: %+v, want [%+v]", messages, want)
	}

	// With the outbox gone, order 43's INSERT succeeds and its message's fails: the transaction
	// rolls back, and the order is not placed.
	if _, err := db.Exec("RENAME TABLE outbox TO outbox_away"); err != nil {
		t.Fatal(err)
	}
	if got, body := program.Post(t, "http://"+addr+"/orders/43"); got != http.StatusInternalServerError {
		t.Errorf("POST /orders/43 with no outbox: %d %s, want %d", got, body, http.StatusInternalServerError)
	}
	if got := placedOrders(t, db); !slices.Equal(got, wantOrders) {
		t.Errorf("orders after an order whose message failed: %q, want %q", got, wantOrders)
	}

	p.Interrupt(t, time.Minute)
}

// placedOrders returns the orders table's rows as "id status", by id.
func placedOrders(t *testing.T, db *sql.DB) []string {
	t.Helper()
	rows, err := db.Query("SELECT CONCAT(id, ' ', status) FROM orders ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var orders []string
	for rows.Next() {
		var o string
		if err := rows.Scan(&o); err != nil {
			t.Fatal(err)
		}
		orders = append(orders, o)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return orders
}
