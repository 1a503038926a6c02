// Command mysqlstasher is examples/stasher on MySQL or MariaDB: a tiny order service that
// announces each order it places on Kafka through a transactional outbox. It writes the order and
// the outbox row of its message in one transaction with package stasher/mysqlstasher, so that
// both commit or neither does.
//
//	go run ./examples/mysqlstasher -dsn 'root:secret@tcp(localhost:3306)/shop' -addr localhost:8080
//	curl -X POST localhost:8080/orders/42
//
// It creates the orders table and the outbox where they are missing, and serves until SIGINT or
// SIGTERM; -table names another outbox table. The flags, the HTTP side and the signals are
// examples/internal/orders', which examples/stasher shares. A reaper publishes the rows, with
// this reaper.yaml (docs/mysql.md says more):
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
	"fmt"
	"strconv"

	gomysql "github.com/go-sql-driver/mysql" // also registers the "mysql" database/sql driver

	"github.com/goharvest/goharvest/driver/mysql"
	"github.com/goharvest/goharvest/examples/internal/orders"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher/mysqlstasher"
)

// main runs the service (orders.Main): it opens the database the flags name, calls createTables,
// makes the stasher, and places each order it is sent with placeOrder.
func main() {
	orders.Main("mysqlstasher", "mysql", "root@tcp(localhost:3306)/shop", createTables, mysqlstasher.New, placeOrder)
}

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
		return fmt.Errorf("order %d: %w", id, orders.ErrExists)
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
