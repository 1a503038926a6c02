package bench_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
	"github.com/goharvest/goharvest/internal/testkit/pgbouncer"
	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
	"github.com/goharvest/goharvest/internal/testkit/testlog"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/internal/testkit/verifytest"
	outboxpkg "github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// The benchmarks share one setup, which docs/performance.md's figures name: a throwaway Postgres
// with its default durability (fsync and synchronous commit on), a Kafka-protocol broker (kfake) in a
// child process, so that the CPU this process uses is the harvester's (plus the benchmark's own
// writers and consumer, where it has them), a topic of 16 partitions, values of 256 bytes, and
// one harvester with its default limits (heartbeat timeout 1s so that it leads sooner).
// make bench runs them all once (-benchtime 1x) and prints one table; each reports:
//
//	records/s       records published (drains) or written (sustained, latency) per second
//	relay-µs/rec    this process's CPU per record
//	pg-µs/rec       Postgres's CPU per record
//	pg-harv-µs/rec  the CPU of the Postgres backends serving the harvester's connections, per
//	                record: pg-µs/rec without the writers' inserts and Postgres's own background work
//	p50-ms, p99-ms  from the writer's commit to arrival at a read_committed consumer
//	idle-q/s        statements the harvester ran per second against an empty outbox
//	peak-MiB        this process's peak resident memory during the run
const (
	benchTopic      = "bench"
	benchPartitions = 16
	benchValueSize  = 256
)

// BenchmarkDrain: a backlog of 200,000 records over 10,000 keys, drained by one harvester.
func BenchmarkDrain(b *testing.B) {
	byClaim(b, func(b *testing.B, claim goharvest.ClaimStrategy) { benchDrain(b, 200_000, 10_000, 0, claim) })
}

// byClaim runs a benchmark once with each claim strategy (Config.ClaimStrategy), the default
// first, so that one run compares them on the same machine at the same moment.
func byClaim(b *testing.B, bench func(b *testing.B, claim goharvest.ClaimStrategy)) {
	for _, claim := range []goharvest.ClaimStrategy{goharvest.ClaimRead, goharvest.ClaimMark} {
		b.Run("claim="+string(claim), func(b *testing.B) { bench(b, claim) })
	}
}

// BenchmarkDrainHotKeys: 50,000 records over only 10 keys. With one record per key in flight
// (MaxKeyRun 1, the default) the keys, not the database, set the pace; with runs of up to 100
// records per key per transaction they do not.
func BenchmarkDrainHotKeys(b *testing.B) {
	for _, run := range []int{1, 100} {
		b.Run("maxKeyRun="+strconv.Itoa(run), func(b *testing.B) { benchDrain(b, 50_000, 10, run, goharvest.DefaultClaimStrategy) })
	}
}

// BenchmarkDrainMillion: 1,000,000 records over 10,000 keys, for the peak memory of a large
// drain, which the in-flight limit should bound, and for what the dead rows that purges leave at
// the head of the table cost each claim.
func BenchmarkDrainMillion(b *testing.B) {
	byClaim(b, func(b *testing.B, claim goharvest.ClaimStrategy) { benchDrain(b, 1_000_000, 10_000, 0, claim) })
}

// BenchmarkDrainPastHeldKey: BenchmarkDrain's backlog behind a row that cannot be published (an
// invalid topic name) and 5,000 more rows of its key, more than the in-flight limit (4,000): the
// held key must not slow the other keys down. It ends when only the held key's rows are left.
func BenchmarkDrainPastHeldKey(b *testing.B) {
	const records, keys, behind = 200_000, 10_000, 5_000
	rig := startBenchRig(b)
	for range b.N {
		run := rig.newRun()
		ctx := context.Background()
		_, err := run.pool.Exec(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			SELECT now(), CASE WHEN i = 0 THEN 'not a topic!' ELSE $1 END, 'held', 'v', '{}', '{}' FROM generate_series(0, $2) AS i`,
			benchTopic, behind)
		if err != nil {
			b.Fatal(err)
		}
		run.loadBacklog(records, keys)
		b.ResetTimer()
		m := rig.measure()
		run.startHarvester()
		testwait.For(b, 10*time.Minute, "every key but the held one to drain", func() bool {
			var others bool
			if err := run.pool.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM outbox WHERE kafka_key <> 'held')").Scan(&others); err != nil {
				b.Fatal(err)
			}
			return !others
		})
		m.stop(b, records)
		b.StopTimer()
		if n := run.rows("outbox"); n != behind+1 {
			b.Fatalf("%d rows left; want the held row and the %d behind it", n, behind)
		}
		run.close()
	}
}

// benchDrain drains a backlog of records over keys; maxKeyRun 0 is the default.
func benchDrain(b *testing.B, records, keys, maxKeyRun int, claim goharvest.ClaimStrategy) {
	startBenchRig(b).drain(records, keys, maxKeyRun, claim)
}

// drain is benchDrain on a rig already started.
func (rig *benchRig) drain(records, keys, maxKeyRun int, claim goharvest.ClaimStrategy) {
	b := rig.b
	for range b.N {
		run := rig.newRun()
		run.maxKeyRun, run.claim = maxKeyRun, claim
		run.loadBacklog(records, keys)
		b.ResetTimer()
		m := rig.measure()
		db := run.tableStats()
		run.startHarvester()
		// What the drain's records/s includes besides publishing: the election and the first
		// epoch's start, from Start until the first records are in flight.
		testwait.UntilEvery(time.Minute, time.Millisecond, func() bool { return run.h.InFlightRecords() > 0 })
		b.ReportMetric(time.Since(m.start).Seconds(), "start-s")
		testwait.For(b, 10*time.Minute, "the outbox to drain", run.empty)
		m.stop(b, records)
		b.StopTimer()
		run.stopHarvester() // its connections report their statistics as they close
		run.reportTableStats(db, records)
		run.reportStatements(records)
		run.close()
	}
}

// reportStatements reports, from pg_stat_statements, how long the mark and the purge took per
// call in the server and how many rows each call carried: what the profile of a drain comes down
// to on the database's side. The purge is a DELETE inside a statement that also checks the server
// (postgres_failover.go), whose row count in pg_stat_statements is that of its one-row answer, so
// the rows it carried are taken from the drain: purged, every record.
func (r *benchRun) reportStatements(purged int) {
	claim := "UPDATE % SET leader_id = $1%RETURNING%"
	if r.claim != goharvest.ClaimMark {
		claim = "SELECT % WHERE id NOT IN (SELECT unnest($1::bigint[]))%"
	}
	for _, st := range []struct {
		name, like string
		rows       int64 // the rows the statement carried in all, when pg_stat_statements cannot tell
	}{
		{name: "claim", like: claim},
		{name: "purge", like: "%DELETE FROM % WHERE id = ANY($1)%", rows: int64(purged)},
	} {
		var calls, rows int64
		var total float64
		err := r.pool.QueryRow(context.Background(), `SELECT coalesce(sum(calls), 0)::bigint, coalesce(sum(rows), 0)::bigint,
			coalesce(sum(total_exec_time), 0) FROM pg_stat_statements
			WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND query LIKE $1`, st.like).Scan(&calls, &rows, &total)
		if err != nil {
			r.b.Fatal(err)
		}
		if calls == 0 {
			r.b.Fatalf("pg_stat_statements saw no %s statement", st.name)
		}
		if st.rows > 0 {
			rows = st.rows
		}
		r.b.ReportMetric(total/float64(calls), st.name+"-ms/call")
		r.b.ReportMetric(float64(rows)/float64(calls), st.name+"-rows/call")
	}
}

// BenchmarkSustained: writers stash records (8 connections, 10 records per transaction, 1,000
// keys) for 20 s while the harvester publishes them, at several fixed rates and then as fast as
// they can ("max"). It reports the write rate, the largest and the final backlog, and the
// latency: the harvester keeps up at a rate when the backlog stays small and p99 under 1 s.
func BenchmarkSustained(b *testing.B) {
	for _, rate := range []float64{2000, 5000, 10000, 15000, 0} {
		name := "rate=" + strconv.Itoa(int(rate))
		if rate == 0 {
			name = "rate=max"
		}
		if rate == 5000 {
			// The rate every machine keeps up with compares the claim strategies.
			b.Run(name, func(b *testing.B) {
				byClaim(b, func(b *testing.B, claim goharvest.ClaimStrategy) { benchSustained(b, rate, claim, 0) })
			})
			continue
		}
		b.Run(name, func(b *testing.B) { benchSustained(b, rate, goharvest.DefaultClaimStrategy, 0) })
	}
}

// BenchmarkCommitCadence: what Limits.CommitCadence trades at light load, where it matters:
// BenchmarkSustained at 2,000 records/s on one shard and BenchmarkSustainedShards at 800 records/s
// on 8, each with the cadences below; and at 10,000 records/s, where records are plentiful,
// whether the default costs throughput. 1ms is none (a transaction commits as soon as nothing
// more can join it, as before the setting), the baseline of each rate's ratios. The cases of a
// rate share one Postgres server and one broker and run one after the other, each in a fresh
// database and reporting to its own b, so that the cadence is the only difference between them.
// The "/linger.ms=N" cases also have the producer linger as long as the cadence (the commit
// flushes it anyway), so that a cadence's records reach the broker in one produce request per
// broker rather than one a millisecond.
func BenchmarkCommitCadence(b *testing.B) {
	type cadence struct {
		every    time.Duration
		lingerMs int
	}
	light := []cadence{{time.Millisecond, 0}, {20 * time.Millisecond, 0}, {50 * time.Millisecond, 0},
		{100 * time.Millisecond, 0}, {200 * time.Millisecond, 0}, {50 * time.Millisecond, 50}, {100 * time.Millisecond, 100}}
	for _, c := range []struct {
		rate     float64
		shards   int
		cadences []cadence
	}{
		{2000, 1, light},
		{800, 8, light},
		{10000, 1, []cadence{{time.Millisecond, 0}, {goharvest.Limits{}.WithDefaults().CommitCadence, 0}}},
	} {
		name := "rate=" + strconv.Itoa(int(c.rate))
		if c.shards > 1 {
			name += "/shards=" + strconv.Itoa(c.shards)
		}
		b.Run(name, func(b *testing.B) {
			rig := startBenchRig(b)
			for _, cadence := range c.cadences {
				name := "commitCadence=" + cadence.every.String()
				if cadence.lingerMs > 0 {
					name += "/linger.ms=" + strconv.Itoa(cadence.lingerMs)
				}
				b.Run(name, func(b *testing.B) {
					rig.b, rig.commitCadence, rig.lingerMs = b, cadence.every, cadence.lingerMs
					rig.sustained(c.rate, goharvest.DefaultClaimStrategy, 0, c.shards)
				})
			}
		})
	}
}

// BenchmarkWritersWithRollbacks: BenchmarkSustained at 3,000 records/s from 16 writers, each of
// which rolls back one transaction of ten records in every four it begins, leaving gaps in the
// ids that nothing will fill. Neither strategy may wait for them.
func BenchmarkWritersWithRollbacks(b *testing.B) {
	byClaim(b, func(b *testing.B, claim goharvest.ClaimStrategy) { benchSustained(b, 3000, claim, 4) })
}

// benchSustained has writers stash at rate (0: as fast as they can) for 20 s while a harvester
// claiming by claim publishes; with rollbackEvery, each writer rolls back one transaction in
// that many.
func benchSustained(b *testing.B, rate float64, claim goharvest.ClaimStrategy, rollbackEvery int) {
	startBenchRig(b).sustained(rate, claim, rollbackEvery, 1)
}

// BenchmarkSustainedShards: BenchmarkSustained at 800 to 10,000 records/s with the outbox split
// into 8 shards (Config.Shards), all led by the one harvester, as docs/operations.md recommends
// for scaling out: each shard commits transactions of its own, so the transactions carry fewer
// records and Kafka takes more of them (txn/s) than with one shard at the same rate.
func BenchmarkSustainedShards(b *testing.B) {
	for _, rate := range []float64{800, 2000, 5000, 10000} {
		b.Run("rate="+strconv.Itoa(int(rate))+"/shards=8", func(b *testing.B) {
			startBenchRig(b).sustained(rate, goharvest.DefaultClaimStrategy, 0, 8)
		})
	}
}

// sustained is benchSustained on a rig already started, with the outbox in shards shards.
func (rig *benchRig) sustained(rate float64, claim goharvest.ClaimStrategy, rollbackEvery, shards int) {
	b := rig.b
	for range b.N {
		run := rig.newRun()
		run.claim = claim
		if shards > 1 {
			run.shardIndex(shards)
		}
		run.startHarvester()
		c := run.startConsumer()
		writers := 8
		if rollbackEvery > 0 {
			writers = 16
		}
		w := run.writers(writers, 10, 1000, rate)
		w.rollbackEvery = rollbackEvery
		db := run.tableStats()
		b.ResetTimer()
		m := rig.measure()
		var maxBacklog int
		done := w.runFor(20 * time.Second)
	sample:
		for {
			select {
			case <-done:
				break sample
			case <-time.After(time.Second):
				maxBacklog = max(maxBacklog, run.rows("outbox"))
			}
		}
		endBacklog := run.rows("outbox")
		m.stop(b, w.total())
		b.StopTimer()
		c.await(w)
		c.report(b, w)
		b.ReportMetric(float64(maxBacklog), "max-backlog")
		b.ReportMetric(float64(endBacklog), "end-backlog")
		run.stopHarvester()
		run.reportRowStats(db, w.total())
		run.close()
	}
}

// BenchmarkMarkLatency: four writers grow the outbox to 1,000,000 rows while a binding marks
// 100 rows at a time from the head and purges them, as a harvester that has fallen behind
// would. When the table passes 100,000 rows and again at 1,000,000, the writers pause while 50
// marks are timed, so that the figures compare the query, not how busy the two cores were. A
// mark that walks the primary key from the head costs the same at both sizes. The "generic"
// case, for contrast, has the binding use named prepared statements, as pgx does by default,
// and forces the generic plan that such a statement can settle on after five executions: it is
// planned once, while the table is small, and kept. (A generic plan of the unnamed statement the
// binding uses otherwise would be planned afresh each time.) The "pooled" case takes the
// binding's statements through PgBouncer in transaction mode, where no session setting can be
// relied on.
func BenchmarkMarkLatency(b *testing.B) {
	b.Run("custom", func(b *testing.B) { benchMarkLatency(b, "", "") })
	b.Run("generic", func(b *testing.B) {
		benchMarkLatency(b, " default_query_exec_mode=cache_statement plan_cache_mode=force_generic_plan", "")
	})
	b.Run("pooled", func(b *testing.B) { benchMarkLatency(b, "", pgbouncer.Transaction) })
}

func benchMarkLatency(b *testing.B, dsnSuffix, poolMode string) {
	rig := startBenchRig(b)
	for range b.N {
		run := rig.newRun()
		dsn := run.dsn + dsnSuffix
		if poolMode != "" {
			bouncer, err := pgbouncer.Start(run.dsn, poolMode)
			if err != nil {
				b.Fatal(err)
			}
			defer bouncer.Stop()
			dsn = bouncer.DSN(run.dsn)
		}
		binding, err := postgres.New(dsn, "outbox")
		if err != nil {
			b.Fatal(err)
		}
		const target, writers, batch = 1_000_000, 4, 1000
		var (
			written atomic.Int64
			// Each writer holds paused's read lock while it writes a batch; timed takes the write
			// lock, which waits for the batches under way and holds the writers back until it is done.
			paused sync.RWMutex
			wg     sync.WaitGroup
		)
		w := run.writers(writers, batch, 10_000, 0)
		for i := range writers {
			wg.Go(func() {
				for written.Load() < target {
					paused.RLock()
					w.writeOne(i)
					paused.RUnlock()
					written.Add(batch)
				}
			})
		}
		b.ResetTimer()
		m := rig.measure()
		ctx := context.Background()
		leader := uuid.New()
		mark := func() time.Duration {
			began := time.Now()
			records, err := binding.Mark(ctx, leader, 100)
			took := time.Since(began)
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]int64, len(records))
			for i, r := range records {
				ids[i] = r.ID
			}
			if _, err := binding.Purge(ctx, ids); err != nil {
				b.Fatal(err)
			}
			return took
		}
		timed := func() float64 {
			paused.Lock() // the writers pause
			var took []time.Duration
			for range 50 {
				took = append(took, mark())
			}
			paused.Unlock()
			return medianMillis(took)
		}
		var small float64
		for written.Load() < 100_000 {
			mark()
		}
		small = timed()
		for written.Load() < target {
			mark()
		}
		wg.Wait()
		large := timed()
		m.stop(b, target)
		b.StopTimer()
		binding.Dispose()
		b.ReportMetric(small, "mark-ms-at-100k")
		b.ReportMetric(large, "mark-ms-at-1M")
		run.close()
	}
}

func medianMillis(ds []time.Duration) float64 {
	if len(ds) == 0 {
		return 0
	}
	return percentileMillis(ds, 0.5)
}

// percentileMillis sorts ds and returns its q-quantile in milliseconds.
func percentileMillis(ds []time.Duration, q float64) float64 {
	slices.Sort(ds)
	return float64(ds[min(len(ds)-1, int(q*float64(len(ds))))].Microseconds()) / 1000
}

// BenchmarkLatency: 1,000 records/s (4 connections, one record per transaction, 1,000 keys) for
// 20 s; the latency is the figure of interest.
func BenchmarkLatency(b *testing.B) {
	rig := startBenchRig(b)
	for range b.N {
		run := rig.newRun()
		run.startHarvester()
		c := run.startConsumer()
		w := run.writers(4, 1, 1000, 1000)
		b.ResetTimer()
		m := rig.measure()
		<-w.runFor(20 * time.Second)
		m.stop(b, w.total())
		b.StopTimer()
		c.await(w)
		c.report(b, w)
		run.close()
	}
}

// BenchmarkIdle: an empty outbox for 10 s, counting the statements the harvester runs (from
// pg_stat_statements) and the CPU it costs per second; then 50 records written one at a time,
// 100 to 300 ms apart, each to an outbox gone idle again, for the latency of a record that wakes
// the harvester.
func BenchmarkIdle(b *testing.B) {
	rig := startBenchRig(b)
	for range b.N {
		run := rig.newRun()
		run.startHarvester()
		c := run.startConsumer()
		time.Sleep(time.Second) // past the first empty marks
		b.ResetTimer()
		m := rig.measure()
		statements := run.statements()
		const idle = 10 * time.Second
		time.Sleep(idle)                             // the idle stretch whose queries are counted
		queries := run.statements() - statements - 1 // less the first count's own statement
		m.stopIdle(b, queries)
		w := run.writers(1, 1, 50, 0)
		for range 50 {
			time.Sleep(time.Duration(100+rand.IntN(200)) * time.Millisecond) // a trickle: one record now and then
			w.writeOne(0)
		}
		b.StopTimer()
		c.await(w)
		c.report(b, w)
		run.close()
	}
}

// benchRig is the Postgres server and broker that a benchmark's runs share.
type benchRig struct {
	b      *testing.B
	server *pgcluster.Server
	broker benchBroker
	runs   int // harvesters started, for unique election groups
	// commits counts the Kafka transactions the running harvester of this process has committed;
	// nil while none runs here (the scaling benchmarks run theirs in child processes).
	commits func() float64

	// Set by BenchmarkAwaitStandbys only: the server's streaming standby, whose CPU is reported
	// beside the server's, and Limits.AwaitStandbys of the harvesters the rig starts.
	standby       *pgcluster.Server
	awaitStandbys int
	// Set by BenchmarkCommitCadence only: Limits.CommitCadence of the harvesters the rig starts
	// (0: the default), and their producers' linger.ms (0: the reaper's default).
	commitCadence time.Duration
	lingerMs      int
	// Set by BenchmarkCycleStatements only: each measurement logs the statements that ran.
	logStatements bool
	// Set by the MySQL benchmarks only (mysql_test.go): the server that holds their outboxes
	// instead of server, which is nil then; its CPU is reported as mysql-µs/rec.
	mysql *mariadbtest.Server
}

// dbCPU is the CPU time the outbox's database server has used: Postgres's, or MySQL's.
func (rig *benchRig) dbCPU() time.Duration {
	if rig.mysql != nil {
		return pidCPU(rig.b, rig.mysql.PID())
	}
	return mustCPU(rig.b, rig.server)
}

// dbUnit is the unit of the database's CPU per record.
func (rig *benchRig) dbUnit() string {
	if rig.mysql != nil {
		return "mysql-µs/rec"
	}
	return "pg-µs/rec"
}

// benchBroker is the Kafka a benchmark runs against, in processes of its own so that its CPU is
// not counted as the harvester's.
type benchBroker struct {
	Addr string
	pids func() []int
}

// EnvBenchClient picks the harvesters' Kafka client: "franz" (the default) or "librdkafka".
// make bench passes CLIENT on.
const EnvBenchClient = "GOHARVEST_BENCH_CLIENT"

// EnvBenchBroker picks the benchmarks' broker: "kafka" (Apache Kafka, one node; the default),
// "kafka3" (three nodes, topics replicated three ways, min.insync.replicas 2) or "kfake" (the
// fake broker earlier figures came from). make bench passes BROKER on.
const EnvBenchBroker = "GOHARVEST_BENCH_BROKER"

func startBenchBroker(b *testing.B) benchBroker {
	switch kind := os.Getenv(EnvBenchBroker); kind {
	case "kfake":
		p := kafkatest.StartProcess(b, map[string]int32{benchTopic: benchPartitions})
		return benchBroker{Addr: p.Addr, pids: func() []int { return []int{p.Cmd.Process.Pid} }}
	case "", "kafka", "kafka3":
		nodes := 1
		if kind == "kafka3" {
			nodes = 3
		}
		c := kafkacluster.Start(b, kafkacluster.Nodes(nodes))
		c.Topic(b, benchTopic, benchPartitions)
		return benchBroker{Addr: c.Addr(), pids: func() []int {
			var pids []int
			for _, n := range c.Nodes() {
				pids = append(pids, n.PID())
			}
			return pids
		}}
	default:
		b.Fatalf("%s=%q: want kafka, kafka3 or kfake", EnvBenchBroker, kind)
		return benchBroker{}
	}
}

// cpu is the CPU time the broker's processes have used.
func (k benchBroker) cpu(b *testing.B) time.Duration {
	var total time.Duration
	for _, pid := range k.pids() {
		total += pidCPU(b, pid)
	}
	return total
}

// jitCPU is the part of cpu that the brokers' JIT compiler threads have used. A JVM compiles its
// hot code in its first minutes, and a benchmark's broker is minutes old: in 20 s at 2,000
// records/s a fresh broker's compiler took about as much CPU as the rest of it did, and a broker
// that has run for hours spends nearly none. A compiler thread that ends takes its CPU out of
// the sum, so a figure taken as cpu less this one can only be too high. Zero for kfake, a Go
// process.
func (k benchBroker) jitCPU(b *testing.B) time.Duration {
	var total time.Duration
	for _, pid := range k.pids() {
		tasks, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(pid), "task"))
		if err != nil {
			b.Fatal(err)
		}
		for _, task := range tasks {
			comm, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", task.Name(), "comm"))
			if err != nil || !jitThread.Match(comm) {
				continue // ended, or not a compiler
			}
			tid, _ := strconv.Atoi(task.Name())
			if cpu, err := pgcluster.ThreadCPU(pid, tid); err == nil { // else it ended meanwhile
				total += cpu
			}
		}
	}
	return total
}

// jitThread matches the names of HotSpot's compiler threads ("C1 CompilerThread0", cut to 15
// bytes by the kernel).
var jitThread = regexp.MustCompile(`^C[12] CompilerThre`)

func startBenchRig(b *testing.B) *benchRig { return startBenchRigWith(b, pgcluster.StartDurable) }

// startBenchRigWith is startBenchRig on a server that start starts.
func startBenchRigWith(b *testing.B, start func() (*pgcluster.Server, error)) *benchRig {
	b.StopTimer()
	server, err := start()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { server.Stop() })
	rig := &benchRig{b: b, server: server, broker: startBenchBroker(b)}
	rig.warmUp()
	return rig
}

// benchRun is one harvester over a fresh database.
type benchRun struct {
	rig       *benchRig
	b         *testing.B
	dsn       string
	drop      func() error
	pool      *pgxpool.Pool
	h         *goharvest.Harvest
	run       string // stamped on the records, for the consumer
	consumers []*benchConsumer
	maxKeyRun int                     // Limits.MaxKeyRun of the harvester; 0 is the default
	claim     goharvest.ClaimStrategy // Config.ClaimStrategy of the harvester; "" is the default
	shards    int                     // Config.Shards of the harvester; 0 is the default
	group     string                  // the election group of the run's harvesters, set by startHarvester
	// database is the outbox's database (reaper's database:); "" is Postgres.
	database reaper.Database
	// stash writes records to the run's outbox in one transaction of their own.
	stash func(ctx context.Context, records []goharvest.OutboxRecord) error
	// mysqlDB is the MySQL outbox's database, for a MySQL run (mysql_test.go); pool is nil then.
	mysqlDB *sql.DB
}

func (rig *benchRig) newRun() *benchRun {
	b := rig.b
	b.StopTimer()
	dsn, drop, err := rig.server.CreateDatabase()
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	if err := postgres.CreateOutboxTable(ctx, dsn, "outbox", outboxpkg.TableOptions{}); err != nil {
		b.Fatal(err)
	}
	// Enough connections for the writers; the harvester has a pool of its own.
	pool, err := pgxpool.New(ctx, dsn+" pool_max_conns=16")
	if err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		b.Fatal(err)
	}
	st, _ := stasher.New("outbox")
	stash := func(ctx context.Context, records []goharvest.OutboxRecord) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return st.StashPgx(ctx, tx, records...) })
	}
	return &benchRun{rig: rig, b: b, dsn: dsn, drop: drop, pool: pool, run: uuid.NewString(), stash: stash}
}

func (r *benchRun) startHarvester() {
	r.rig.runs++
	r.group = fmt.Sprintf("bench-%d-%d", os.Getpid(), r.rig.runs)
	cfg, err := r.harvesterConfig().config()
	if err != nil {
		r.b.Fatal(err)
	}
	h, err := goharvest.New(cfg)
	if err != nil {
		r.b.Fatal(err)
	}
	registry := cfg.MetricsRegisterer.(*prometheus.Registry)
	r.rig.commits = func() float64 { return commits(r.b, registry) }
	if err := h.Start(); err != nil {
		r.b.Fatal(err)
	}
	r.h = h
	testwait.For(r.b, time.Minute, "leadership", h.IsLeader)
}

// benchHarvesterConfig is what sets a benchmark's harvester apart from the others; it travels as
// JSON to a harvester in a child process (see scale_test.go).
type benchHarvesterConfig struct {
	Broker, DSN, Group, Client       string
	Shards, MaxKeyRun, AwaitStandbys int
	Claim                            goharvest.ClaimStrategy
	CommitCadence                    time.Duration
	Database                         reaper.Database
	LingerMs                         int
}

func (r *benchRun) harvesterConfig() benchHarvesterConfig {
	return benchHarvesterConfig{Broker: r.rig.broker.Addr, DSN: r.dsn, Group: r.group, Client: os.Getenv(EnvBenchClient),
		Shards: r.shards, MaxKeyRun: r.maxKeyRun, AwaitStandbys: r.rig.awaitStandbys, Claim: r.claim,
		CommitCadence: r.rig.commitCadence, LingerMs: r.rig.lingerMs, Database: r.database}
}

// config returns the harvester's Config, with the drivers the reaper would make of the same
// settings.
func (c benchHarvesterConfig) config() (goharvest.Config, error) {
	switch c.Client {
	case "", "franz", "librdkafka":
	default:
		return goharvest.Config{}, fmt.Errorf("%s=%q: want librdkafka or franz", EnvBenchClient, c.Client)
	}
	var producer reaper.KafkaConfigMap
	if c.LingerMs > 0 {
		producer = reaper.KafkaConfigMap{"linger.ms": c.LingerMs}
	}
	return reaper.Settings{
		Config: goharvest.Config{
			LeaderGroupID:     c.Group,
			LeaderTopic:       c.Group + ".leader",
			Shards:            c.Shards,
			ClaimStrategy:     c.Claim,
			Limits:            goharvest.Limits{HeartbeatTimeout: time.Second, MinPollInterval: 50 * time.Millisecond, MaxKeyRun: c.MaxKeyRun, AwaitStandbys: c.AwaitStandbys, CommitCadence: c.CommitCadence},
			Logger:            testlog.Logger(),
			MetricsRegisterer: prometheus.NewRegistry(),
		},
		KafkaClient:         reaper.KafkaClient(c.Client),
		BaseKafkaConfig:     reaper.KafkaConfigMap{"bootstrap.servers": c.Broker},
		ProducerKafkaConfig: producer,
		Database:            c.Database,
		DataSource:          withAppName(c.Database, c.DSN),
	}.HarvestConfig()
}

// commits returns how many Kafka transactions the harvester whose metrics registry holds has
// committed: the count of its commit_duration_seconds histogram.
func commits(b *testing.B, registry *prometheus.Registry) float64 {
	families, err := registry.Gather()
	if err != nil {
		b.Fatal(err)
	}
	var n uint64
	for _, f := range families {
		if f.GetName() == "goharvest_commit_duration_seconds" {
			for _, m := range f.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return float64(n)
}

// shardIndex makes the run's harvesters publish the outbox in shards shards (Config.Shards), and
// creates the index a sharded outbox needs.
func (r *benchRun) shardIndex(shards int) {
	ddl, err := outboxpkg.ShardIndexDDL("outbox", shards)
	if err != nil {
		r.b.Fatal(err)
	}
	r.exec(ddl)
	r.shards = shards
}

func (r *benchRun) close() {
	r.stopHarvester()
	for _, c := range r.consumers {
		c.close()
	}
	r.pool.Close()
	r.drop()
}

// stopHarvester stops the run's harvester, if it is running.
func (r *benchRun) stopHarvester() {
	if r.h == nil {
		return
	}
	r.rig.commits = nil
	r.h.Stop()
	if err := r.h.Await(); err != nil {
		r.b.Fatal(err)
	}
	r.h = nil
}

// tableStats is what Postgres counted of the outbox table and its WAL at one moment.
type tableStats struct {
	wal              string // pg_current_wal_lsn()
	updated, deleted int64  // pg_stat_user_tables.n_tup_upd and n_tup_del
}

// tableStats reads the outbox's statistics now.
func (r *benchRun) tableStats() tableStats {
	var s tableStats
	err := r.pool.QueryRow(context.Background(), `SELECT pg_stat_clear_snapshot(), pg_current_wal_lsn()::text, n_tup_upd, n_tup_del
		FROM pg_stat_user_tables WHERE relname = 'outbox'`).Scan(nil, &s.wal, &s.updated, &s.deleted)
	if err != nil {
		r.b.Fatal(err)
	}
	return s
}

// reportTableStats reports what the drain of records cost the database since before, per record:
// the WAL written (wal-B/rec: the harvester's alone, since the backlog was written before),
// rows updated (upd/rec) and tuples left dead by updates and deletes (dead/rec), which vacuum
// must clear. It waits until the statistics count every purge: the harvester's connections
// report theirs as they close.
func (r *benchRun) reportTableStats(before tableStats, records int) {
	var after tableStats
	testwait.For(r.b, 10*time.Second, "the statistics to count every purge", func() bool {
		after = r.tableStats()
		return after.deleted-before.deleted >= int64(records)
	})
	var wal int64
	err := r.pool.QueryRow(context.Background(), `SELECT pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::bigint`, after.wal, before.wal).Scan(&wal)
	if err != nil {
		r.b.Fatal(err)
	}
	r.b.ReportMetric(float64(wal)/float64(records), "wal-B/rec")
	r.reportRows(before, after, records)
}

// reportRowStats reports rows updated and tuples left dead per record (see reportTableStats) by a
// run whose writers wrote records while the harvester ran, whose WAL is theirs as much as its.
func (r *benchRun) reportRowStats(before tableStats, records int) {
	var after tableStats
	testwait.For(r.b, 10*time.Second, "the statistics to count every purge", func() bool {
		after = r.tableStats()
		return after.deleted-before.deleted >= int64(records)
	})
	r.reportRows(before, after, records)
}

func (r *benchRun) reportRows(before, after tableStats, records int) {
	updated, deleted := after.updated-before.updated, after.deleted-before.deleted
	r.b.ReportMetric(float64(updated)/float64(records), "upd/rec")
	r.b.ReportMetric(float64(updated+deleted)/float64(records), "dead/rec")
}

// loadBacklog stashes records over keys, round robin, before the harvester starts.
func (r *benchRun) loadBacklog(records, keys int) {
	ctx := context.Background()
	st, _ := stasher.New("outbox")
	value := strings.Repeat("v", benchValueSize)
	batch := make([]goharvest.OutboxRecord, 0, 5000)
	for i := range records {
		batch = append(batch, goharvest.OutboxRecord{KafkaTopic: benchTopic, KafkaKey: "key-" + strconv.Itoa(i%keys), KafkaValue: &value})
		if len(batch) == cap(batch) || i == records-1 {
			if err := st.StashPgx(ctx, r.pool, batch...); err != nil {
				r.b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	if _, err := r.pool.Exec(ctx, "VACUUM ANALYZE outbox"); err != nil {
		r.b.Fatal(err)
	}
}

// empty asks cheaply whether the outbox is empty, so that watching costs Postgres little.
func (r *benchRun) empty() bool {
	var rows bool
	if err := r.pool.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM outbox)").Scan(&rows); err != nil {
		r.b.Fatal(err)
	}
	return !rows
}

// statements counts the statements run so far in this run's database.
func (r *benchRun) statements() int64 {
	var n int64
	err := r.pool.QueryRow(context.Background(), `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
		WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
	if err != nil {
		r.b.Fatal(err)
	}
	return n
}

// measurement is CPU time, peak memory and Kafka transactions from start to stop.
type measurement struct {
	rig                        *benchRig
	start                      time.Time
	relay, pg, standby, broker time.Duration
	brokerJIT                  time.Duration // of broker, the JIT compiler's
	commits                    float64
	harvesterPG                *backendCPU // nil where the server's processes cannot be read
}

func (rig *benchRig) measure() *measurement {
	resetPeakRSS(rig.b)
	rig.b.StartTimer()
	if rig.logStatements {
		resetStatements(rig.b, rig.server)
	}
	m := &measurement{rig: rig, start: time.Now(), relay: processCPU(), pg: rig.dbCPU(), broker: rig.broker.cpu(rig.b),
		brokerJIT: rig.broker.jitCPU(rig.b)}
	if rig.server != nil {
		m.harvesterPG = startBackendCPU(rig.b, rig.server)
	}
	if rig.commits != nil {
		m.commits = rig.commits()
	}
	if rig.standby != nil {
		m.standby = mustCPU(rig.b, rig.standby)
	}
	return m
}

// stopIdle reports CPU per second rather than per record, and statements per second.
func (m *measurement) stopIdle(b *testing.B, statements int64) {
	elapsed := time.Since(m.start)
	relay, pg := processCPU()-m.relay, mustCPU(b, m.rig.server)-m.pg
	if m.harvesterPG != nil {
		m.harvesterPG.close()
	}
	b.ReportMetric(float64(statements)/elapsed.Seconds(), "idle-q/s")
	b.ReportMetric(float64(relay.Milliseconds())/elapsed.Seconds(), "relay-ms/s")
	b.ReportMetric(float64(pg.Milliseconds())/elapsed.Seconds(), "pg-ms/s")
	b.ReportMetric(float64(peakRSS(b))/(1<<20), "peak-MiB")
}

func (m *measurement) stop(b *testing.B, records int) {
	elapsed := time.Since(m.start)
	relay, pg := processCPU()-m.relay, m.rig.dbCPU()-m.pg
	b.ReportMetric(float64(records)/elapsed.Seconds(), "records/s")
	b.ReportMetric(float64(relay.Microseconds())/float64(records), "relay-µs/rec")
	b.ReportMetric(float64(pg.Microseconds())/float64(records), m.rig.dbUnit())
	if m.harvesterPG != nil {
		if harvester, ok := m.harvesterPG.total(); ok {
			b.ReportMetric(float64(harvester.Microseconds())/float64(records), "pg-harv-µs/rec")
		}
	}
	broker := m.rig.broker.cpu(b) - m.broker
	b.ReportMetric(float64(broker.Microseconds())/float64(records), "broker-µs/rec")
	jit := max(0, m.rig.broker.jitCPU(b)-m.brokerJIT)
	b.ReportMetric(float64(jit.Microseconds())/float64(records), "broker-jit-µs/rec")
	if m.rig.commits != nil {
		if commits := m.rig.commits() - m.commits; commits > 0 {
			b.ReportMetric(commits/elapsed.Seconds(), "txn/s")
			b.ReportMetric(float64(records)/commits, "rec/txn")
			if m.rig.logStatements {
				logStatements(b, m.rig.server, elapsed, commits)
			}
		}
	}
	if m.rig.standby != nil {
		standby := mustCPU(b, m.rig.standby) - m.standby
		b.ReportMetric(float64(standby.Microseconds())/float64(records), "standby-µs/rec")
	}
	b.ReportMetric(float64(peakRSS(b))/(1<<20), "peak-MiB")
}

// benchWriters stash stamped records from several connections and remember when each record's
// transaction committed. Key k belongs to writer k mod n, so each key's records commit in order.
type benchWriters struct {
	r     *benchRun
	st    *stasher.Stasher
	value string
	batch int
	rate  float64 // records/s for all writers together; 0: as fast as they can
	keys  [][]string
	next  []map[string]int64 // per writer: the next sequence number of each key
	// rollbackEvery, when not 0, has each writer roll back one transaction of a batch of records
	// in every rollbackEvery it begins: ids taken and never committed, as failing requests leave.
	rollbackEvery int
	txns          []int // per writer: transactions begun

	// send, when set, hands each batch to Kafka instead of the outbox, for the floor a relay is
	// measured against (see BenchmarkFloorIdempotentProducer); it returns once Kafka has them.
	send func(ctx context.Context, records []outboxpkg.Record) error

	mu        sync.Mutex
	committed map[string]time.Time // by key/seq
}

func (r *benchRun) writers(n, batch, keys int, rate float64) *benchWriters {
	st, _ := stasher.New("outbox")
	w := &benchWriters{r: r, st: st, value: strings.Repeat("v", benchValueSize), batch: batch, rate: rate,
		committed: map[string]time.Time{}}
	w.keys = make([][]string, n)
	w.next = make([]map[string]int64, n)
	w.txns = make([]int, n)
	for k := range keys {
		w.keys[k%n] = append(w.keys[k%n], "key-"+strconv.Itoa(k))
	}
	for i := range n {
		w.next[i] = map[string]int64{}
	}
	return w
}

// runFor writes for d and closes the returned channel when every writer has finished.
func (w *benchWriters) runFor(d time.Duration) <-chan struct{} {
	done := make(chan struct{})
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for i := range w.keys {
		wg.Go(func() {
			var interval time.Duration
			if w.rate > 0 {
				interval = time.Duration(float64(time.Second) * float64(w.batch*len(w.keys)) / w.rate)
			}
			next := time.Now()
			for time.Now().Before(deadline) {
				w.writeOne(i)
				if interval > 0 {
					next = next.Add(interval)
					time.Sleep(time.Until(next)) // paces the load at the rate asked
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	return done
}

// errRollback rolls back a writer's transaction on purpose.
var errRollback = errors.New("rolled back on purpose")

// writeOne commits one transaction of writer i's batch of records (after one it rolls back, now
// and then: see rollbackEvery).
func (w *benchWriters) writeOne(i int) {
	ctx := context.Background()
	if w.rollbackEvery > 0 {
		if w.txns[i]++; w.txns[i]%w.rollbackEvery == 0 {
			discarded := make([]goharvest.OutboxRecord, w.batch)
			for j := range discarded {
				discarded[j] = goharvest.OutboxRecord{KafkaTopic: benchTopic, KafkaKey: "rolled-back", KafkaValue: &w.value}
			}
			err := pgx.BeginFunc(ctx, w.r.pool, func(tx pgx.Tx) error {
				if err := w.st.StashPgx(ctx, tx, discarded...); err != nil {
					return err
				}
				return errRollback
			})
			if !errors.Is(err, errRollback) {
				w.r.b.Error(err)
			}
		}
	}
	keys, next := w.keys[i], w.next[i]
	batch := make([]goharvest.OutboxRecord, 0, w.batch)
	ids := make([]string, 0, w.batch)
	for len(batch) < w.batch {
		key := keys[0]
		keys = append(keys[1:], key)
		batch = append(batch, verify.Record(benchTopic, key, w.r.run, next[key], &w.value))
		ids = append(ids, key+"/"+strconv.FormatInt(next[key], 10))
		next[key]++
	}
	w.keys[i] = keys
	if w.send != nil {
		// The floor's clock starts when the records are handed over, as a relay's starts when
		// the writer commits.
		handed := time.Now()
		if err := w.send(ctx, batch); err != nil {
			w.r.b.Error(err)
			return
		}
		w.mu.Lock()
		for _, id := range ids {
			w.committed[id] = handed
		}
		w.mu.Unlock()
		return
	}
	if err := w.r.stash(ctx, batch); err != nil {
		w.r.b.Error(err)
		return
	}
	now := time.Now()
	w.mu.Lock()
	for _, id := range ids {
		w.committed[id] = now
	}
	w.mu.Unlock()
}

func (w *benchWriters) total() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.committed)
}

func (w *benchWriters) expected() map[string]int64 {
	out := map[string]int64{}
	for i := range w.next {
		for k, n := range w.next[i] {
			out[k] = n
		}
	}
	return out
}

// benchConsumer reads the topic as a read_committed consumer would, checks order and
// completeness, and notes when each record arrived.
type benchConsumer struct {
	cl      *kgo.Client
	mu      sync.Mutex
	checker *verify.Checker
	arrived map[string]time.Time // by key/seq, the first arrival
	cancel  context.CancelFunc
	done    chan struct{}
}

func (r *benchRun) startConsumer() *benchConsumer {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(r.rig.broker.Addr, ",")...), kgo.ConsumeTopics(benchTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		r.b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &benchConsumer{cl: cl, checker: verify.NewChecker(r.run), arrived: map[string]time.Time{}, cancel: cancel, done: make(chan struct{})}
	r.consumers = append(r.consumers, c)
	go func() {
		defer close(c.done)
		for ctx.Err() == nil {
			fetches := cl.PollFetches(ctx)
			now := time.Now()
			c.mu.Lock()
			fetches.EachRecord(func(rec *kgo.Record) {
				stamp, err := verifytest.ParseRecord(rec)
				if err != nil || !c.checker.Observe(string(rec.Key), stamp, now) {
					return
				}
				id := string(rec.Key) + "/" + strconv.FormatInt(stamp.Seq, 10)
				if _, seen := c.arrived[id]; !seen {
					c.arrived[id] = now
				}
			})
			c.mu.Unlock()
		}
	}()
	return c
}

// await waits until every record written has arrived, for at most a minute.
func (c *benchConsumer) await(w *benchWriters) {
	want := w.total()
	testwait.Until(time.Minute, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.arrived) >= want
	})
}

// report checks that every record arrived in per-key order and reports the commit-to-arrival
// latency.
func (c *benchConsumer) report(b *testing.B, w *benchWriters) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rep := c.checker.Report(w.expected())
	if !rep.OK() {
		b.Fatalf("the run did not arrive intact:\n%s", rep)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	latencies := make([]time.Duration, 0, len(w.committed))
	for id, committed := range w.committed {
		latencies = append(latencies, c.arrived[id].Sub(committed))
	}
	slices.Sort(latencies)
	ms := func(q float64) float64 {
		return float64(latencies[min(len(latencies)-1, int(q*float64(len(latencies))))].Microseconds()) / 1000
	}
	b.ReportMetric(ms(0.50), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
}

func (c *benchConsumer) close() {
	c.cancel()
	<-c.done
	c.cl.Close()
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

// resetPeakRSS starts the kernel's peak resident memory count (VmHWM) afresh.
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Fatalf("reset peak RSS: %v", err)
	}
}

// peakRSS is this process's peak resident memory, in bytes, since resetPeakRSS.
func peakRSS(b *testing.B) int64 { return procPeakRSS(b, "self") }

// procPeakRSS is the peak resident memory (VmHWM), in bytes, of the process /proc/<proc>.
func procPeakRSS(b *testing.B, proc string) int64 { return procStatus(b, proc, "VmHWM:") << 10 }

// procStatus is a number field of /proc/<proc>/status (in kB for memory).
func procStatus(b *testing.B, proc, field string) int64 {
	status, err := os.ReadFile("/proc/" + proc + "/status")
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, field); ok {
			n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatalf("no %s in /proc/%s/status", field, proc)
	return 0
}

// warmUp drains a backlog of 50,000 records, untimed, before a rig's first measurement. Each rig
// starts a broker of its own, and a JVM runs its first seconds with code not yet compiled: the
// broker then takes more than a core, and a benchmark of ten seconds measured the warming of the
// JVM more than the harvester (a 200,000-record drain ran at 16,911 to 19,592 records/s cold
// against 22,364 to 23,870 warmed, the mark strategy's at 13,047 to 13,490 against 13,290 to
// 15,047, on this 2-core machine). A broker in production is warm.
func (rig *benchRig) warmUp() {
	run := rig.newRun()
	run.loadBacklog(50_000, 1_000)
	run.startHarvester()
	testwait.For(rig.b, 10*time.Minute, "the warm-up backlog to drain", run.empty)
	run.close()
}
