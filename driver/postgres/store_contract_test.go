package postgres_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	outboxpkg "github.com/goharvest/goharvest/outbox"
)

var contractTables atomic.Int32

// The Postgres store keeps the store contract that the engine relies on, and that the in-memory
// store keeps too (driver/memory and internal/engine/owner run the same suite on it): made from a data
// source, or on a pool of the caller's.
func TestStoreContract(t *testing.T) {
	ctx := context.Background()
	dataSource := pgtest.NewDatabase(t)
	pool, err := pgxpool.New(ctx, dataSource)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	for name, open := range map[string]func(table string) (*postgres.Store, error){
		"New":         func(table string) (*postgres.Store, error) { return postgres.New(dataSource, table) },
		"NewWithPool": func(table string) (*postgres.Store, error) { return postgres.NewWithPool(pool, table) },
	} {
		t.Run(name, func(t *testing.T) { runStoreContract(t, ctx, dataSource, pool, open) })
	}
}

// A store on the caller's pool leaves it open when disposed of: the pool is the caller's.
func TestNewWithPoolLeavesThePoolToTheCaller(t *testing.T) {
	ctx := context.Background()
	dataSource := pgtest.NewOutbox(t)
	pool, err := pgxpool.New(ctx, dataSource)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	b, err := postgres.NewWithPool(pool, "outbox")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	b.Dispose()
	if err := pool.Ping(ctx); err != nil {
		t.Fatalf("the caller's pool after Dispose: %v", err)
	}
	if _, err := postgres.NewWithPool(pool, "a.b.c"); err == nil {
		t.Fatal("NewWithPool accepted the table a.b.c")
	}
}

func runStoreContract(t *testing.T, ctx context.Context, dataSource string, pool *pgxpool.Pool, open func(table string) (*postgres.Store, error)) {
	drivertest.RunStore(t, func(t *testing.T) drivertest.Outbox {
		table := fmt.Sprintf("contract_%d", contractTables.Add(1))
		if err := postgres.CreateOutboxTable(ctx, dataSource, table, outboxpkg.TableOptions{}); err != nil {
			t.Fatal(err)
		}
		b, err := open(table)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(b.Dispose)
		exec := func(t *testing.T, sql string, args ...any) pgx.Rows {
			t.Helper()
			rows, err := pool.Query(ctx, sql, args...)
			if err != nil {
				t.Fatal(err)
			}
			return rows
		}
		return drivertest.Outbox{
			Store: b,
			Insert: func(t *testing.T, recs ...driver.OutboxRecord) []int64 {
				var ids []int64
				for _, r := range recs {
					keys, values := []string{}, []string{}
					for _, h := range r.KafkaHeaders {
						keys, values = append(keys, h.Key), append(values, h.Value)
					}
					rows := exec(t, `INSERT INTO `+table+` (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
						VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`, r.CreateTime, r.KafkaTopic, r.KafkaKey, r.KafkaValue, keys, values)
					id, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
					if err != nil {
						t.Fatal(err)
					}
					ids = append(ids, id)
				}
				return ids
			},
			SetValue: func(t *testing.T, id int64, value string) {
				exec(t, `UPDATE `+table+` SET kafka_value = $2 WHERE id = $1`, id, value).Close()
			},
			Delete: func(t *testing.T, id int64) {
				exec(t, `DELETE FROM `+table+` WHERE id = $1`, id).Close()
			},
			InsertMalformed: func(t *testing.T, key string) int64 {
				rows := exec(t, `INSERT INTO `+table+` (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
					VALUES (now(), 'topic', $1, 'v', '{a,b}', '{1}') RETURNING id`, key)
				id, err := pgx.CollectExactlyOneRow(rows, pgx.RowTo[int64])
				if err != nil {
					t.Fatal(err)
				}
				return id
			},
			Exists: func(t *testing.T, id int64) bool {
				n, err := pgx.CollectExactlyOneRow(exec(t, `SELECT count(*) FROM `+table+` WHERE id = $1`, id), pgx.RowTo[int64])
				if err != nil {
					t.Fatal(err)
				}
				return n == 1
			},
		}
	})
}
