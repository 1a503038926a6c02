package bench_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver/mysql"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/stasher/mysqlstasher"
)

// The MySQL benchmarks are BenchmarkDrain and BenchmarkSustained with the outbox in MariaDB
// (Debian's server) rather than Postgres, on the same broker and with the same harvester
// settings, so that their rows stand beside the Postgres ones. The server keeps every commit
// through a crash (innodb_flush_log_at_trx_commit=1), as the Postgres of the benchmarks does
// (fsync and synchronous commit on), without a binary log, with the server's default buffer
// pool and redo log. They report mysql-µs/rec, the
// server's CPU per record (the writers' inserts included), where the Postgres rows report
// pg-µs/rec; without notifications, the harvester polls the table (the reaper's default for a
// MySQL outbox, limits.maxMarkBackoff 100ms).

// BenchmarkMySQLDrain: a backlog of 200,000 records over 10,000 keys, drained by one harvester,
// with each claim strategy.
func BenchmarkMySQLDrain(b *testing.B) {
	byClaim(b, func(b *testing.B, claim goharvest.ClaimStrategy) {
		const records, keys = 200_000, 10_000
		rig := startMySQLRig(b)
		for range b.N {
			run := rig.newMySQLRun()
			run.claim = claim
			run.loadMySQLBacklog(records, keys)
			b.ResetTimer()
			m := rig.measure()
			run.startHarvester()
			testwait.For(b, 10*time.Minute, "the outbox to drain", run.mysqlEmpty)
			m.stop(b, records)
			b.StopTimer()
			run.stopHarvester()
		}
	})
}

// BenchmarkMySQLSustained: 8 writers commit batches of 10 records over 1,000 keys at 2,000 and
// 5,000 records/s for 20 s while the harvester publishes them, and a read_committed consumer
// checks order and completeness and times each record from its commit.
func BenchmarkMySQLSustained(b *testing.B) {
	for _, rate := range []float64{2000, 5000} {
		b.Run("rate="+strconv.Itoa(int(rate)), func(b *testing.B) {
			rig := startMySQLRig(b)
			for range b.N {
				run := rig.newMySQLRun()
				run.startHarvester()
				c := run.startConsumer()
				w := run.writers(8, 10, 1000, rate)
				b.ResetTimer()
				m := rig.measure()
				<-w.runFor(20 * time.Second)
				m.stop(b, w.total())
				b.StopTimer()
				c.await(w)
				c.report(b, w)
				run.stopHarvester()
				c.close()
			}
		})
	}
}

// startMySQLRig starts a MariaDB server and a broker for one benchmark's runs.
func startMySQLRig(b *testing.B) *benchRig {
	b.StopTimer()
	// The server's own sizes (MariaDB 10.11's defaults), not the small ones of a throwaway test
	// server: with a 32M redo log its commits stalled for up to 1.6s every few seconds at
	// 2,000 rows/s while it flushed pages to make room.
	server, err := mariadbtest.Start(mariadbtest.Durable(false), mariadbtest.InnoDBMemory("128M", "96M"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { server.Stop() })
	rig := &benchRig{b: b, mysql: server, broker: startBenchBroker(b)}
	// A warmed broker, as startBenchRig's warmUp gives the Postgres benchmarks.
	run := rig.newMySQLRun()
	run.loadMySQLBacklog(50_000, 1_000)
	run.startHarvester()
	testwait.For(b, 10*time.Minute, "the warm-up backlog to drain", run.mysqlEmpty)
	run.stopHarvester()
	return rig
}

// newMySQLRun makes a database with an outbox on the rig's MariaDB server, dropped when the
// benchmark ends.
func (rig *benchRig) newMySQLRun() *benchRun {
	b := rig.b
	b.StopTimer()
	dsn, drop, err := rig.mysql.CreateDatabase()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { drop() })
	if err := mysql.CreateOutboxTable(context.Background(), dsn, "outbox"); err != nil {
		b.Fatal(err)
	}
	db := mariadbtest.Open(b, dsn)
	db.SetMaxOpenConns(16) // enough for the writers; the harvester has a pool of its own
	st, err := mysqlstasher.New("outbox")
	if err != nil {
		b.Fatal(err)
	}
	stash := func(ctx context.Context, records []goharvest.OutboxRecord) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := st.Stash(ctx, tx, records...); err != nil {
			tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	return &benchRun{rig: rig, b: b, dsn: dsn, run: uuid.NewString(), database: reaper.DatabaseMySQL, stash: stash, mysqlDB: db}
}

// loadMySQLBacklog writes records over keys, in transactions of 5,000.
func (r *benchRun) loadMySQLBacklog(records, keys int) {
	value := strings.Repeat("v", benchValueSize)
	batch := make([]goharvest.OutboxRecord, 0, 5000)
	for i := range records {
		batch = append(batch, goharvest.OutboxRecord{KafkaTopic: benchTopic, KafkaKey: "key-" + strconv.Itoa(i%keys), KafkaValue: &value})
		if len(batch) == cap(batch) || i == records-1 {
			if err := r.stash(context.Background(), batch); err != nil {
				r.b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
}

// mysqlEmpty reports whether the run's MySQL outbox is empty.
func (r *benchRun) mysqlEmpty() bool {
	var rows bool
	if err := r.mysqlDB.QueryRowContext(context.Background(), "SELECT EXISTS (SELECT 1 FROM outbox)").Scan(&rows); err != nil {
		r.b.Fatal(err)
	}
	return !rows
}
