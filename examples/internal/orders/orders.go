// Package orders is the HTTP side that the order-service examples (examples/stasher on Postgres,
// examples/mysqlstasher on MySQL) share, so that each example's own file is about its database:
// how it writes an order and its outbox row in one transaction. Only those examples import it.
package orders

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"
)

// ErrExists is what a PlaceFunc returns, wrapped, for an order placed before; the client gets
// 409 Conflict.
var ErrExists = errors.New("the order exists")

// PlaceFunc places order id: it writes the order and the message that announces it in one
// transaction, or neither.
type PlaceFunc func(ctx context.Context, id int) error

// Serve serves POST /orders/{id} on addr, placing each order with place, until ctx ends (the
// examples' SIGINT or SIGTERM); then it lets the requests under way finish, for up to ten
// seconds. Once it listens it logs "taking orders" with the address and the outbox table.
func Serve(ctx context.Context, addr, table string, place PlaceFunc) error {
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
