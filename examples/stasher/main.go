// Command stasher is a tiny order service that announces each order it places on Kafka through a
// transactional outbox: it writes the order and the outbox row of its message in one transaction
// with package stasher, so that both commit or neither does. A harvester publishes the rows: run
// examples/embed (or the reaper) on the same database.
//
//	go run ./examples/stasher -dsn 'host=localhost dbname=orders user=postgres' -addr localhost:8080
//	curl -X POST localhost:8080/orders/42
//
// It creates the orders table and the outbox where they are missing, and serves until SIGINT or
// SIGTERM. It links pgx's database/sql driver and the stasher, and neither the harvester nor a
// Kafka client: it builds with CGO_ENABLED=0.
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver

	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

func main() {
	dsn := flag.String("dsn", "host=localhost port=5432 user=postgres dbname=postgres sslmode=disable", "Postgres data source of the service's database")
	addr := flag.String("addr", "localhost:8080", "address to serve HTTP on")
	table := flag.String("table", outbox.DefaultTable, "outbox table")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dsn, *addr, *table); err != nil {
		fmt.Fprintln(os.Stderr, "stasher:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn, addr, table string) error {
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := createTables(ctx, db, table); err != nil {
		return err
	}
	st, err := stasher.New(table)
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(r.PathValue("id"))
		if err != nil {
			http.Error(w, "an order's id is a number", http.StatusBadRequest)
			return
		}
		switch err := placeOrder(r.Context(), db, st, id); {
		case errors.Is(err, errOrderExists):
			http.Error(w, err.Error(), http.StatusConflict)
		case err != nil:
			slog.Error("an order was not placed", "id", id, "error", err)
			http.Error(w, "the order was not placed", http.StatusInternalServerError)
		default:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, "order %d placed\n", id)
		}
	})

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	slog.Info("taking orders; SIGINT or SIGTERM stops", "address", ln.Addr().String(), "table", table)
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

var errOrderExists = errors.New("the order exists")

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
		return fmt.Errorf("order %d: %w", id, errOrderExists)
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
