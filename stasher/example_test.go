package stasher_test

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// Stash a message in the same transaction as the business change it announces: either both
// commit or neither does.
func Example() {
	ctx := context.Background()
	db, err := sql.Open("pgx", exampleDataSource) // any database/sql driver for Postgres works
	if err != nil {
		panic(err)
	}
	defer db.Close()

	if err := placeOrder(ctx, db); err != nil {
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

// placeOrder writes an order and the message that announces it in one transaction, word for word
// what docs/getting-started.md shows (TestDocsQuoteTheExamples, in the root package, holds them
// equal).
func placeOrder(ctx context.Context, db *sql.DB) error {
	st, err := stasher.New("outbox")
	if err != nil {
		return err
	}

	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()

	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, status) VALUES (42, 'placed')"); err != nil {
		return err
	}
	err = st.Stash(ctx, tx, outbox.Record{
		KafkaTopic:   "orders",
		KafkaKey:     "42",
		KafkaValue:   outbox.String(`{"status":"placed"}`),
		KafkaHeaders: outbox.Headers{{Key: "source", Value: "order-service"}},
	})
	if err != nil {
		return err
	}
	return tx.Commit()
}
