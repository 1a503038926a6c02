package mysql_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/driver/mysql"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
)

var contractTables atomic.Int32

// The MySQL store keeps the store contract that the engine relies on, as the Postgres and the
// in-memory stores do, on MariaDB: made from a data source, or on a pool of the caller's.
func TestStoreContract(t *testing.T) {
	dataSource := mariadbtest.NewDatabase(t)
	db := mariadbtest.Open(t, dataSource)
	for name, open := range map[string]func(table string) (*mysql.Store, error){
		"New":       func(table string) (*mysql.Store, error) { return mysql.New(dataSource, table) },
		"NewWithDB": func(table string) (*mysql.Store, error) { return mysql.NewWithDB(db, table) },
	} {
		t.Run(name, func(t *testing.T) { runStoreContract(t, dataSource, db, open) })
	}
}

// unix writes t as seconds since the epoch, for FROM_UNIXTIME, as the store writes times.
func unix(t time.Time) string { return fmt.Sprintf("%d.%06d", t.Unix(), t.Nanosecond()/1000) }

// jsonArray writes strings as a JSON array.
func jsonArray(ss []string) string {
	b := []byte("[")
	for i, s := range ss {
		if i > 0 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%q", s)
	}
	return string(append(b, ']'))
}

// execer is a pool or a transaction.
type execer interface {
	ExecContext(context.Context, string, ...any) (sql.Result, error)
}

// insert writes a record as a writer would, in a transaction of its own or in tx, and returns
// its id.
func insert(t testing.TB, tx execer, table string, r driver.OutboxRecord) int64 {
	t.Helper()
	id, err := write(tx, table, r)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// write is insert for a goroutine of a test, which must not stop the test itself.
func write(tx execer, table string, r driver.OutboxRecord) (int64, error) {
	keys, values := []string{}, []string{}
	for _, h := range r.KafkaHeaders {
		keys, values = append(keys, h.Key), append(values, h.Value)
	}
	res, err := tx.ExecContext(context.Background(), `INSERT INTO `+table+` (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
		VALUES (FROM_UNIXTIME(?), ?, ?, ?, ?, ?)`, unix(r.CreateTime), r.KafkaTopic, r.KafkaKey, r.KafkaValue, jsonArray(keys), jsonArray(values))
	if err != nil {
		return 0, fmt.Errorf("insert into %s: %w", table, err)
	}
	return res.LastInsertId()
}

func runStoreContract(t *testing.T, dataSource string, db *sql.DB, open func(table string) (*mysql.Store, error)) {
	ctx := context.Background()
	drivertest.RunStore(t, func(t *testing.T) drivertest.Outbox {
		table := fmt.Sprintf("contract_%d", contractTables.Add(1))
		if err := mysql.CreateOutboxTable(ctx, dataSource, table); err != nil {
			t.Fatal(err)
		}
		s, err := open(table)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Dispose)
		exec := func(t *testing.T, statement string, args ...any) sql.Result {
			t.Helper()
			res, err := db.ExecContext(ctx, statement, args...)
			if err != nil {
				t.Fatal(err)
			}
			return res
		}
		return drivertest.Outbox{
			Store: s,
			Insert: func(t *testing.T, recs ...driver.OutboxRecord) []int64 {
				var ids []int64
				for _, r := range recs {
					ids = append(ids, insert(t, db, table, r))
				}
				return ids
			},
			SetValue: func(t *testing.T, id int64, value string) {
				exec(t, `UPDATE `+table+` SET kafka_value = ? WHERE id = ?`, value, id)
			},
			Delete: func(t *testing.T, id int64) {
				exec(t, `DELETE FROM `+table+` WHERE id = ?`, id)
			},
			InsertMalformed: func(t *testing.T, key string) int64 {
				id, err := exec(t, `INSERT INTO `+table+` (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
					VALUES (NOW(6), 'topic', ?, 'v', '["a","b"]', '["1"]')`, key).LastInsertId()
				if err != nil {
					t.Fatal(err)
				}
				return id
			},
			Exists: func(t *testing.T, id int64) bool {
				var n int
				if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+table+` WHERE id = ?`, id).Scan(&n); err != nil {
					t.Fatal(err)
				}
				return n == 1
			},
		}
	})
}
