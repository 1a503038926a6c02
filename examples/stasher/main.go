// Command stasher is a tiny order service that announces each order it places on Kafka through a
// transactional outbox: it writes the order and the outbox row of its message in one transaction
// with package stasher, so that both commit or neither does. A harvester publishes the rows: run
// examples/embed (or the reaper) on the same database.
//
//	go run ./examples/stasher -dsn 'host=localhost dbname=orders user=postgres' -addr localhost:8080
//	curl -X POST localhost:8080/orders/42
//
// It creates the orders table and the outbox where they are missing, and serves until SIGINT or
// SIGTERM; -table names another outbox table. The flags, the HTTP side and the signals are
// examples/internal/orders', which examples/mysqlstasher shares. It links pgx's database/sql
// driver and the stasher, and neither the harvester nor a Kafka client: it builds with
// CGO_ENABLED=0.
package main

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/goharvest/goharvest/examples/internal/orders"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// main runs the service (orders.Main): it opens the database the flags name, calls createTables,
// makes the stasher, and places each order it is sent with placeOrder.
func main() {
	orders.Main("stasher", "pgx", "host=localhost port=5432 user=postgres dbname=postgres sslmode=disable",
		createTables, func(table string) (*stasher.Stasher, error) { return stasher.New(table) }, placeOrder)
}

// placeOrder writes order id and the message that announces it in one transaction: both commit or
// neither does. An order placed before is left as it is, and no message is written for it.
func placeOrder(ctx context.Context, db *sql.DB, st *stasher.Stasher, id int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // does nothing once the transaction commits

	res, err := tx.ExecContext(ctx, "INSERT INTO orders (id, status) VALUES ($1, 'placed') ON CONFLICT (id) DO NOTHING", id)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return fmt.Errorf("order %d: %w", id, orders.ErrExists)
	}
	err = st.Stash(ctx, tx, outbox.Record{
		KafkaTopic:   "orders",
		KafkaKey:     strconv.Itoa(id),
		KafkaValue:   outbox.String(fmt.Sprintf(`{"id":%d,"status":"placed"}`, id)),
		KafkaHeaders: outbox.Headers{{Key: "source", Value: "order-service"}},
	})
	if err != nil {
		return err
	}
	return tx.Commit()
}

// createTables creates the service's table and the outbox, where they are missing: the outbox's
// statements come from package outbox, which the reaper's init and the Postgres driver use too.
func createTables(ctx context.Context, db *sql.DB, table string) error {
	ddl, err := outbox.TableDDL(table)
	if err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY, status text NOT NULL);\n"+ddl)
	return err
}
