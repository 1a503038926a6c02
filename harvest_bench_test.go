package goharvest_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/kafkatest"
	"github.com/goharvest/goharvest/internal/pgcluster"
	"github.com/goharvest/goharvest/stasher"
)

// BenchmarkDrain measures how fast one harvester drains a backlog of 100,000 records over
// 10,000 keys (values of about 256 bytes) into a topic of 16 partitions. Postgres runs with its
// default durability; the broker runs in a child process so that the CPU reported as the
// relay's is the harvester's alone. Run it with make bench (-benchtime 1x).
func BenchmarkDrain(b *testing.B) {
	const records, keys = 100_000, 10_000
	server, err := pgcluster.StartDurable()
	if err != nil {
		b.Fatal(err)
	}
	defer server.Stop()
	broker := kafkatest.StartProcess(b, map[string]int32{"bench": 16})
	value := fmt.Sprintf("%0256d", 0)

	for i := range b.N {
		b.StopTimer()
		dsn, drop, err := server.CreateDatabase()
		if err != nil {
			b.Fatal(err)
		}
		loadBacklog(b, dsn, records, keys, value)
		h, err := goharvest.New(goharvest.Config{
			BaseKafkaConfig: goharvest.KafkaConfigMap{"bootstrap.servers": broker.Addr},
			LeaderGroupID:   "bench-" + strconv.Itoa(i),
			LeaderTopic:     "bench-" + strconv.Itoa(i) + ".leader",
			DataSource:      dsn,
			Limits:          goharvest.Limits{HeartbeatTimeout: time.Second, MinPollInterval: 50 * time.Millisecond},
			Logger:          slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: testLogLevel()})),
		})
		if err != nil {
			b.Fatal(err)
		}
		pool, err := pgxpool.New(context.Background(), dsn)
		if err != nil {
			b.Fatal(err)
		}

		b.StartTimer()
		relayBefore, pgBefore := processCPU(), mustCPU(b, server)
		start := time.Now()
		if err := h.Start(); err != nil {
			b.Fatal(err)
		}
		for !empty(b, pool) {
			time.Sleep(20 * time.Millisecond)
		}
		elapsed := time.Since(start)
		relay, pg := processCPU()-relayBefore, mustCPU(b, server)-pgBefore
		b.StopTimer()

		h.Stop()
		if err := h.Await(); err != nil {
			b.Fatal(err)
		}
		pool.Close()
		drop()
		b.ReportMetric(float64(records)/elapsed.Seconds(), "records/s")
		b.ReportMetric(float64(relay.Microseconds())/records, "relay-CPU-µs/record")
		b.ReportMetric(float64(pg.Microseconds())/records, "postgres-CPU-µs/record")
	}
}

func loadBacklog(b *testing.B, dsn string, records, keys int, value string) {
	ctx := context.Background()
	if err := goharvest.CreateOutboxTable(ctx, dsn, "outbox"); err != nil {
		b.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	st, _ := stasher.New("outbox")
	batch := make([]goharvest.OutboxRecord, 0, 5000)
	for i := range records {
		batch = append(batch, goharvest.OutboxRecord{KafkaTopic: "bench", KafkaKey: "key-" + strconv.Itoa(i%keys), KafkaValue: &value})
		if len(batch) == cap(batch) || i == records-1 {
			if err := st.StashPgx(ctx, pool, batch...); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox"); err != nil {
		b.Fatal(err)
	}
}

// empty asks cheaply whether the outbox is empty, so that watching costs Postgres little.
func empty(b *testing.B, pool *pgxpool.Pool) bool {
	var rows bool
	if err := pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM outbox)").Scan(&rows); err != nil {
		b.Fatal(err)
	}
	return !rows
}

// processCPU is this process's user and system CPU time so far.
func processCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func mustCPU(b *testing.B, s *pgcluster.Server) time.Duration {
	d, err := s.CPUTime()
	if err != nil {
		b.Fatal(err)
	}
	return d
}
