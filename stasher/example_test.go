package stasher_test

import (
	"context"
	"database/sql"
	"fmt"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver; any driver for Postgres works

	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// dataSource is where the example finds Postgres: a service's own setting. Under go test, TestMain
// (stasher_test.go) points it at an empty throwaway database.
var dataSource = "host=localhost port=5432 user=postgres dbname=postgres sslmode=disable"

// Stash a message in the same transaction as the business change it announces: either both
// commit or neither does.
//
// The example assumes a Postgres at dataSource (declared above) and creates the tables it writes
// to: the outbox, from outbox.TableDDL's statements, and an orders table. examples/stasher is an
// order service that writes its orders so, as a complete program.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", dataSource)
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ddl, err := outbox.TableDDL("outbox")
	if err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, ddl+";\nCREATE TABLE IF NOT EXISTS orders (id int PRIMARY KEY, status text NOT NULL)"); err != nil {
		panic(err)
	}

	st, err := stasher.New("outbox")
	if err != nil {
		panic(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		panic(err)
	}
	defer tx.Rollback() // does nothing once the transaction commits
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, status) VALUES (42, 'placed')"); err != nil {
		panic(err)
	}
	if err := st.Stash(ctx, tx, outbox.Record{KafkaTopic: "orders", KafkaKey: "42", KafkaValue: outbox.String(`{"status":"placed"}`)}); err != nil {
		panic(err)
	}
	if err := tx.Commit(); err != nil {
		panic(err)
	}

	var topic, key, value string
	err = db.QueryRowContext(ctx, "SELECT kafka_topic, kafka_key, kafka_value FROM outbox").Scan(&topic, &key, &value)
	if err != nil {
		panic(err)
	}
	fmt.Println(topic, key, value)
	// Output: orders 42 {"status":"placed"}
}
