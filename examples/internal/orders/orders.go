// Package orders is what the order-service examples (examples/stasher on Postgres,
// examples/mysqlstasher on MySQL) share, so that each example's own file is about its database:
// how it creates its tables, and how it writes an order and its outbox row in one transaction.
// Only those examples import it.
package orders

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

	"github.com/goharvest/goharvest/outbox"
)

// ErrExists is what an example's placeOrder returns, wrapped, for an order placed before; the
// client gets 409 Conflict.
var ErrExists = errors.New("the order exists")

// Main runs the order service called name. It reads its flags: -dsn, the data source of its
// database for database/sql's driver driverName (defaultDSN unless given), -addr, the address
// to serve HTTP on, and -table, the outbox table. It opens the database, creates the service's
// tables with createTables, makes the stasher of the outbox with newStasher, and serves
// POST /orders/{id}, placing each order with placeOrder, until SIGINT or SIGTERM. On an error
// it prints it after name and exits with status 1.
func Main[S any](name, driverName, defaultDSN string,
	createTables func(ctx context.Context, db *sql.DB, table string) error,
	newStasher func(table string) (S, error),
	placeOrder func(ctx context.Context, db *sql.DB, st S, id int) error,
) {
	dsn := flag.String("dsn", defaultDSN, "data source of the service's database, for the "+driverName+" driver")
	addr := flag.String("addr", "localhost:8080", "address to serve HTTP on")
	table := flag.String("table", outbox.DefaultTable, "outbox table")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := func() error {
		db, err := sql.Open(driverName, *dsn)
		if err != nil {
			return err
		}
		defer db.Close()
		if err := createTables(ctx, db, *table); err != nil {
			return err
		}
		st, err := newStasher(*table)
		if err != nil {
			return err
		}
		return serve(ctx, *addr, *table, func(ctx context.Context, id int) error {
			return placeOrder(ctx, db, st, id)
		})
	}()
	if err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		stop()
		os.Exit(1)
	}
}

// serve serves POST /orders/{id} on addr, placing each order with place, until ctx ends; then it
// lets the requests under way finish, for up to ten seconds. Once it listens it logs "taking
// orders" with the address and the outbox table, which the examples' tests wait for.
func serve(ctx context.Context, addr, table string, place func(ctx context.Context, id int) error) error {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, err := strconv.Atoi(r.PathValue("id"))
		if err != nil {
			http.Error(w, "an order's id is a number", http.StatusBadRequest)
			return
		}
		switch err := place(r.Context(), id); {
		case errors.Is(err, ErrExists):
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
