package bench_test

import (
	"context"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
)

// BenchmarkCycleStatements: BenchmarkSustained at 2,000 records/s on one shard, with the default
// commit cadence, once with each claim strategy, and at 800 records/s on 8 shards with the
// default strategy, counting every statement the run's database runs while it is measured
// (pg_stat_statements, reset as the measurement starts). It logs them one a line, with their
// calls, execution time and rows per second and per cycle (a Kafka transaction committed), and
// reports the harvester's statements per cycle (pg-q/txn): what the harvester asks of Postgres at
// light load, beside the writers' inserts.
func BenchmarkCycleStatements(b *testing.B) {
	rig := startBenchRig(b)
	rig.logStatements = true
	b.Run("rate=2000", func(b *testing.B) {
		byClaim(b, func(b *testing.B, claim goharvest.ClaimStrategy) {
			rig.b = b
			rig.sustained(2000, claim, 0, 1)
		})
	})
	b.Run("rate=800/shards=8", func(b *testing.B) {
		rig.b = b
		rig.sustained(800, goharvest.DefaultClaimStrategy, 0, 8)
	})
}

// harvesterAppName is the application_name of the benchmark harvesters' connections to Postgres,
// by which backendCPU tells the backends serving them from those serving the writers.
const harvesterAppName = "goharvest-bench-harvester"

// backendCPU follows the CPU time of the Postgres backends whose connections carry
// harvesterAppName, from the moment it starts: the harvester's own cost to Postgres, without the
// writers' inserts (nor the background writers, WAL writer, checkpointer or autovacuum). It reads
// each backend's CPU from /proc every pollInterval, so that a backend which exits (the pool closes
// idle connections) keeps what it had used: a connection closes only after it has been idle for a
// while, and so used nothing since its last reading.
type backendCPU struct {
	b    *testing.B
	conn *pgx.Conn

	mu   sync.Mutex
	used map[int]backendUse // by backend PID

	stopOnce  sync.Once
	closeOnce sync.Once
	stop      chan struct{}
	done      chan struct{}
}

// backendUse is one backend's CPU when first seen (0 when it started after backendCPU) and when
// last read.
type backendUse struct{ first, last time.Duration }

const backendPollInterval = 250 * time.Millisecond

// startBackendCPU starts following the harvester's backends on server; nil when server runs
// elsewhere, where their processes cannot be read.
func startBackendCPU(b *testing.B, server *pgcluster.Server) *backendCPU {
	if _, err := server.CPUTime(); err != nil {
		return nil
	}
	conn, err := pgx.Connect(context.Background(), server.AdminDSN())
	if err != nil {
		b.Fatal(err)
	}
	c := &backendCPU{b: b, conn: conn, used: map[int]backendUse{}, stop: make(chan struct{}), done: make(chan struct{})}
	c.read(true)
	go func() {
		defer close(c.done)
		t := time.NewTicker(backendPollInterval)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-t.C:
				c.read(false)
			}
		}
	}()
	b.Cleanup(c.close)
	return c
}

// read takes a reading of every harvester backend running now; at the start, what they used
// before is the baseline.
func (c *backendCPU) read(start bool) {
	rows, err := c.conn.Query(context.Background(), `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, harvesterAppName)
	if err != nil {
		c.b.Error(err)
		return
	}
	pids, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		c.b.Error(err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, pid := range pids {
		cpu, err := pgcluster.ProcessCPU(pid)
		if err != nil {
			continue // the backend has exited since: its last reading stands
		}
		u, seen := c.used[pid]
		if !seen && start {
			u.first = cpu
		}
		u.last = cpu
		c.used[pid] = u
	}
}

// total stops following and returns the CPU the harvester's backends used since the start, and
// whether there were any (a floor runs no harvester, BenchmarkMarkLatency a binding of its own).
func (c *backendCPU) total() (time.Duration, bool) {
	c.stopPolling()
	c.read(false)
	c.close()
	c.mu.Lock()
	defer c.mu.Unlock()
	var total time.Duration
	for _, u := range c.used {
		total += u.last - u.first
	}
	return total, len(c.used) > 0
}

// stopPolling ends the readings every backendPollInterval, which share the connection.
func (c *backendCPU) stopPolling() {
	c.stopOnce.Do(func() {
		close(c.stop)
		<-c.done
	})
}

func (c *backendCPU) close() {
	c.stopPolling()
	c.closeOnce.Do(func() { c.conn.Close(context.Background()) })
}

// resetStatements clears pg_stat_statements, so that what it counts next is the measurement's.
func resetStatements(b *testing.B, server *pgcluster.Server) {
	for _, sql := range []string{"CREATE EXTENSION IF NOT EXISTS pg_stat_statements", "SELECT pg_stat_statements_reset()"} {
		if err := pgcluster.Exec(context.Background(), server.AdminDSN(), sql); err != nil {
			b.Fatal(err)
		}
	}
}

// statementRow is one statement of pg_stat_statements.
type statementRow struct {
	query        string
	calls, rows  int64
	totalMs      float64
	whose        string // "harvester", "writers" or "bench"
	perS, perTxn float64
}

// theirs tells the statements of the benchmark's writers and of the benchmark itself (counting
// rows, reading statistics) from the harvester's. The writers' transactions are pgx's, which
// spells begin and commit in lower case; a shard's claim spells them in upper case
// (driver/postgres's claim), and pg_stat_statements counts the two spellings apart.
var (
	writersStatement = regexp.MustCompile(`^(INSERT INTO "?outbox"?|(?:begin|commit|rollback)$)`)
	benchStatement   = regexp.MustCompile(`^SELECT count\(\*\) FROM outbox$|pg_stat_statements|pg_stat_user_tables|pg_stat_activity|pg_wal_lsn_diff|^SELECT EXISTS \(SELECT 1 FROM outbox`)
)

// logStatements logs every statement that the run's database (every database but the admin one)
// ran since resetStatements, with its calls, time and rows in all, per second of elapsed and per
// Kafka transaction committed, and reports the harvester's statements per transaction and per
// second.
func logStatements(b *testing.B, server *pgcluster.Server, elapsed time.Duration, txns float64) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, server.AdminDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, `SELECT query, calls, rows, total_exec_time FROM pg_stat_statements
		WHERE dbid <> (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY calls DESC`)
	if err != nil {
		b.Fatal(err)
	}
	stmts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (statementRow, error) {
		var s statementRow
		err := row.Scan(&s.query, &s.calls, &s.rows, &s.totalMs)
		return s, err
	})
	if err != nil {
		b.Fatal(err)
	}
	var out strings.Builder
	tw := tabwriter.NewWriter(&out, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "whose\tcalls\tcalls/s\tcalls/txn\texec ms\texec µs/call\trows/call\tquery\n")
	var harvesterCalls int64
	var harvesterMs float64
	for _, s := range stmts {
		s.query = strings.Join(strings.Fields(s.query), " ")
		switch {
		case writersStatement.MatchString(s.query):
			s.whose = "writers"
		case benchStatement.MatchString(s.query):
			s.whose = "bench"
		default:
			s.whose = "harvester"
			harvesterCalls += s.calls
			harvesterMs += s.totalMs
		}
		query := s.query
		if len(query) > 140 {
			query = query[:140] + "…"
		}
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.2f\t%.0f\t%.0f\t%.1f\t%s\n", s.whose, s.calls, float64(s.calls)/elapsed.Seconds(),
			float64(s.calls)/txns, s.totalMs, 1000*s.totalMs/float64(s.calls), float64(s.rows)/float64(s.calls), query)
	}
	tw.Flush()
	b.Logf("statements over %.1fs and %.0f Kafka transactions:\n%s", elapsed.Seconds(), txns, out.String())
	b.ReportMetric(float64(harvesterCalls)/txns, "pg-q/txn")
	b.ReportMetric(float64(harvesterCalls)/elapsed.Seconds(), "pg-q/s")
	b.ReportMetric(1000*harvesterMs/txns, "pg-exec-µs/txn")
}

// withAppName gives a Postgres data source, in key=value or URL form, harvesterAppName; a MySQL
// one it leaves as it is.
func withAppName(database reaper.Database, dsn string) string {
	if database == reaper.DatabaseMySQL {
		return dsn
	}
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("application_name", harvesterAppName)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return dsn + " application_name=" + harvesterAppName
}
