package mysql_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver/memory"
	"github.com/goharvest/goharvest/driver/mysql"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
)

// A harvester on the MySQL store publishes every record, each key's in the order its writers
// wrote them, with no notifications (it polls), while writers commit concurrently and one
// transaction that took a lower id commits only after later ids of other keys were published,
// while more are in flight;
// and it purges what it published. With either claim strategy, and in shards.
func TestHarvestPublishesEveryRecordInKeyOrder(t *testing.T) {
	for _, c := range []struct {
		strategy goharvest.ClaimStrategy
		shards   int
	}{{goharvest.ClaimRead, 1}, {goharvest.ClaimMark, 1}, {goharvest.ClaimRead, 3}} {
		t.Run(fmt.Sprintf("%s/%d shards", c.strategy, c.shards), func(t *testing.T) {
			dataSource := mariadbtest.NewOutbox(t)
			db := mariadbtest.Open(t, dataSource)
			store, err := mysql.New(dataSource, "outbox")
			if err != nil {
				t.Fatal(err)
			}
			kafka := memory.NewKafka(c.shards)
			kafka.Broker.SetLatency(5 * time.Millisecond) // a backlog that drains in about a second
			h, err := goharvest.New(goharvest.Config{
				LeaderGroupID:     "mysql-test",
				LeaderTopic:       "mysql-test.leader",
				ClaimStrategy:     c.strategy,
				Shards:            c.shards,
				MetricsRegisterer: prometheus.NewRegistry(),
				Store:             store,
				Kafka:             kafka,
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				h.Stop()
				if err := h.Await(); err != nil {
					t.Errorf("Await: %v", err)
				}
			}()

			// The late writer takes its id first, and commits once later ids are published.
			late, lateTx := beginWriter(t, db, rec("late", "0"))
			const keys, perKey = 8, 25
			var wg sync.WaitGroup
			for k := range keys {
				wg.Go(func() {
					for i := range perKey {
						if _, err := write(db, "outbox", rec("k"+strconv.Itoa(k), strconv.Itoa(i))); err != nil {
							t.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			// The late record commits while the backlog drains, records of other keys with higher
			// ids in flight: a read forward from the highest id read would let its key's next
			// record, written after that commit, overtake it.
			waitFor(t, "the backlog draining", func() bool { return len(kafka.Broker.Committed()) >= keys*perKey/4 })
			if err := lateTx.Commit(); err != nil {
				t.Fatal(err)
			}
			insert(t, db, "outbox", rec("late", "1")) // written after the late commit: must follow it
			waitFor(t, "every record published", func() bool { return len(kafka.Broker.Committed()) >= keys*perKey+2 })

			next := map[string]int{}
			for _, m := range kafka.Broker.Committed() {
				want := strconv.Itoa(next[string(m.Key)])
				if string(m.Value) != want {
					t.Fatalf("key %s: published %s, want %s next (the late record was %d)", m.Key, m.Value, want, late)
				}
				next[string(m.Key)]++
			}
			if n := len(kafka.Broker.Committed()); n != keys*perKey+2 {
				t.Errorf("published %d messages, want %d", n, keys*perKey+2)
			}
			waitFor(t, "the outbox purged", func() bool {
				var n int
				return db.QueryRow(`SELECT COUNT(*) FROM outbox`).Scan(&n) == nil && n == 0
			})
		})
	}
}

func waitFor(t *testing.T, what string, done func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !done() {
		select {
		case <-ctx.Done():
			t.Fatal(fmt.Errorf("waiting for %s: %w", what, ctx.Err()))
		case <-time.After(20 * time.Millisecond):
		}
	}
}
