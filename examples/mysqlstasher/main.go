// Command mysqlstasher is examples/stasher on MySQL or MariaDB: a tiny order service that
// announces each order it places on Kafka through a transactional outbox. It writes the order and
// the outbox row of its message in one transaction with package stasher/mysqlstasher, so that
// both commit or neither does.
//
//	go run ./examples/mysqlstasher -dsn 'root:secret@tcp(localhost:3306)/shop' -addr localhost:8080
//	curl -X POST localhost:8080/orders/42
//
// It creates the orders table and the outbox where they are missing, and serves until SIGINT or
// SIGTERM; -table names another outbox table. A reaper publishes the rows, with this reaper.yaml
// (docs/mysql.md says more):
//
//	harvest:
//	  baseKafkaConfig:
//	    bootstrap.servers: localhost:9092
//	  leaderTopic: shop.leader
//	  leaderGroupID: shop
//	  database: mysql
//	  dataSource: root:${MYSQL_PASSWORD}@tcp(localhost:3306)/shop
//	  outboxTable: outbox
//
//	reaper -f reaper.yaml
//
// It links go-sql-driver/mysql, the stasher and, for the outbox's DDL, the MySQL store
// (driver/mysql, pure Go, whose only other dependencies are package driver's interfaces and
// package outbox), and neither the harvester nor a Kafka client: it builds with CGO_ENABLED=0.
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

	gomysql "github.com/go-sql-driver/mysql" // also registers the "mysql" database/sql driver

	"github.com/goharvest/goharvest/driver/mysql"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher/mysqlstasher"
)

func main() {
	dsn := flag.String("dsn", "root@tcp(localhost:3306)/shop", "MySQL data source (go-sql-driver's form) of the service's database")
	addr := flag.String("addr", "localhost:8080", "address to serve HTTP on")
	table := flag.String("table", outbox.DefaultTable, "outbox table")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *dsn, *addr, *table); err != nil {
		fmt.Fprintln(os.Stderr, "mysqlstasher:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dsn, addr, table string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := createTables(ctx, db, table); err != nil {
		return err
	}
	st, err := mysqlstasher.New(table)
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

// erDupEntry is the error number MySQL and MariaDB give an INSERT of a primary key that exists.
const erDupEntry = 1062

// placeOrder writes order id and the message that announces it in one transaction: both commit or
// neither does. An order placed before is left as it is, and no message is written for it.
func placeOrder(ctx context.Context, db *sql.DB, st *mysqlstasher.Stasher, id int) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() // does nothing once the transaction commits

	_, err = tx.ExecContext(ctx, "INSERT INTO orders (id, status) VALUES (?, 'placed')", id)
	var myErr *gomysql.MySQLError
	if errors.As(err, &myErr) && myErr.Number == erDupEntry {
		return fmt.Errorf("order %d: %w", id, errOrderExists)
	}
	if err != nil {
		return err
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

// createTables creates the service's table and the outbox, where they are missing, one statement
// at a time (go-sql-driver sends several in one call only if the data source allows it): the
// outbox's statements come from driver/mysql, which the reaper's init uses too.
func createTables(ctx context.Context, db *sql.DB, table string) error {
	ddl, err := mysql.TableDDL(table)
	if err != nil {
		return err
	}
	ddl = append([]string{"CREATE TABLE IF NOT EXISTS orders (id BIGINT PRIMARY KEY, status VARCHAR(20) NOT NULL) ENGINE=InnoDB"}, ddl...)
	for _, statement := range ddl {
		if _, err := db.ExecContext(ctx, statement); err != nil {
			return err
		}
	}
	return nil
}
