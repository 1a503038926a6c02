package bench_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/buildtest"
	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/stasher"
)

// BenchmarkIdleOutboxes: what idle outboxes cost. One reaper process (cmd/reaper, built for the
// run: with cgo for librdkafka, without for franz, as `make image` builds them) publishes 50
// outboxes, 10 tables in each of 5 databases of one Postgres, 1 shard each: at the default
// (recommended) limits, and with the election's rates a fifth to a third of those
// (heartbeatTimeout 15s, minPollInterval 500ms), since the election is most of what an idle
// outbox costs. Once every outbox has published one record (so each leads, and has made its
// producer), the reaper is left idle for the window (a minute, or GOHARVEST_BENCH_IDLE_WINDOW;
// the reaper's CPU of each whole minute is printed as it goes, since it drifts over minutes as
// much as it differs between runs), and each row reports:
//
//	reaper-core-%     the reaper's CPU over the idle window, in percent of one core
//	pg-core-%         Postgres's CPU meanwhile (every server process, the benchmark's own
//	                  two queries at the window's ends included)
//	broker-core-%     the broker's CPU meanwhile
//	pg-xact/s         transactions the outboxes' databases committed per second meanwhile
//	peak-MiB          the reaper's peak resident memory, start and election included
//	rss-MiB           its resident memory at the window's end
//	goroutines        its goroutines at the window's end (go_goroutines of its /metrics)
//	threads           its OS threads (librdkafka runs several per client)
//	pg-conns          Postgres connections the reaper held at the window's end, all outboxes
//	pg-conns/outbox   the most any one outbox held (by application_name), sampled every 10s
//	kafka-conns       TCP connections from the reaper to the broker at the window's end
//	other-cores       the CPU the machine's other processes used meanwhile, in cores: the
//	                  figures mean little unless it is near 0
func BenchmarkIdleOutboxes(b *testing.B) {
	b.StopTimer()
	server, err := pgcluster.StartDurable()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { server.Stop() })
	broker := startBenchBroker(b)
	client := os.Getenv(EnvBenchClient)
	if client == "" {
		client = "franz"
	}
	var bin string
	if client == "franz" {
		bin = buildtest.BinaryWithoutCgo(b, "github.com/goharvest/goharvest/cmd/reaper")
	} else {
		bin = buildtest.Binary(b, "github.com/goharvest/goharvest/cmd/reaper")
	}
	b.Run("limits=default", func(b *testing.B) { benchIdleOutboxes(b, server, broker, bin, client, "") })
	b.Run("heartbeatTimeout=15s/minPollInterval=500ms", func(b *testing.B) {
		benchIdleOutboxes(b, server, broker, bin, client, "  limits:\n    heartbeatTimeout: 15s\n    minPollInterval: 500ms\n")
	})
}

// benchIdleOutboxes is one run of BenchmarkIdleOutboxes, with limits (YAML under harvest:) added
// to the reaper's file.
func benchIdleOutboxes(b *testing.B, server *pgcluster.Server, broker benchBroker, bin, client, limits string) {
	const databases, perDatabase = 5, 10
	b.StopTimer()
	idleRuns++
	for range b.N {
		var dsns []string
		var outboxes []idleOutbox
		for d := range databases {
			dsn, drop, err := server.CreateDatabase()
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { drop() })
			dsns = append(dsns, dsn)
			for t := range perDatabase {
				n := d*perDatabase + t
				// Named apart from earlier runs' outboxes, whose groups and topics the broker keeps.
				outboxes = append(outboxes, idleOutbox{name: fmt.Sprintf("idle-%d-%02d", idleRuns, n), dsn: dsn, table: fmt.Sprintf("outbox_%02d", n)})
			}
		}
		dir := b.TempDir()
		config := filepath.Join(dir, "reaper.yaml")
		admin := freeBenchAddr(b)
		yaml := "harvest:\n  kafkaClient: " + client + "\n  baseKafkaConfig:\n    bootstrap.servers: " + broker.Addr + "\n" + limits +
			"logging:\n  level: warn\nadmin:\n  address: " + admin + "\noutboxes:\n"
		for _, o := range outboxes {
			// The application name tells the outboxes' connections apart in pg_stat_activity.
			yaml += fmt.Sprintf("  - outbox: %s\n    dataSource: %q\n    outboxTable: %s\n", o.name, o.dsn+" application_name="+o.name, o.table)
		}
		if err := os.WriteFile(config, []byte(yaml), 0o600); err != nil {
			b.Fatal(err)
		}
		if out, err := exec.Command(bin, "init", "-f", config).CombinedOutput(); err != nil {
			b.Fatalf("reaper init: %v\n%s", err, out)
		}
		reaper := startIdleReaper(b, bin, config)

		// Every outbox publishes one record, and so leads and has its producer.
		ctx := context.Background()
		for _, o := range outboxes {
			st, err := stasher.New(o.table)
			if err != nil {
				b.Fatal(err)
			}
			conn, err := pgx.Connect(ctx, o.dsn)
			if err != nil {
				b.Fatal(err)
			}
			value := "warm"
			if err := st.StashPgx(ctx, conn, goharvest.OutboxRecord{KafkaTopic: benchTopic, KafkaKey: o.name, KafkaValue: &value}); err != nil {
				b.Fatal(err)
			}
			conn.Close(ctx)
		}
		testwait.For(b, 5*time.Minute, "every outbox to publish its record", func() bool {
			for _, o := range outboxes {
				if n := idleRows(b, o); n > 0 {
					return false
				}
			}
			return true
		})
		// Idle: the listener's next check (10s after the last notification) vouches for the
		// database, so readiness pings stop using the pool, whose connections then close after
		// 10s unused, looked for every 5s.
		time.Sleep(idleOutboxesSettle)

		pid := reaper.cmd.Process.Pid
		perOutbox := maxConnsPerOutbox(b, server)
		xacts := committed(b, server, dsns)
		cpu, pg, brokerCPU, machine := pidCPU(b, pid), mustCPU(b, server), broker.cpu(b), machineCPU(b)
		start := time.Now()
		window := idleWindow(b)
		fmt.Fprintf(os.Stderr, "the reaper (pid %d) idles; measuring for %v\n", pid, window)
		minute, minuteStart, minuteCPU := 1, start, cpu
		for time.Since(start) < window {
			time.Sleep(min(10*time.Second, window-time.Since(start)))
			perOutbox = max(perOutbox, maxConnsPerOutbox(b, server))
			if time.Since(start) >= time.Duration(minute)*time.Minute {
				now, at := pidCPU(b, pid), time.Now()
				fmt.Fprintf(os.Stderr, "minute %d of the window: the reaper used %.2f%% of a core, with %d Kafka connections\n",
					minute, 100*(now-minuteCPU).Seconds()/at.Sub(minuteStart).Seconds(), tcpConnsTo(b, pid, broker.Addr))
				minute, minuteStart, minuteCPU = minute+1, at, now
			}
		}
		elapsed := time.Since(start)
		used, pgUsed, brokerUsed := pidCPU(b, pid)-cpu, mustCPU(b, server)-pg, broker.cpu(b)-brokerCPU
		others := machineCPU(b) - machine - used - pgUsed - brokerUsed
		xacts = committed(b, server, dsns) - xacts

		b.ReportMetric(100*used.Seconds()/elapsed.Seconds(), "reaper-core-%")
		b.ReportMetric(100*pgUsed.Seconds()/elapsed.Seconds(), "pg-core-%")
		b.ReportMetric(100*brokerUsed.Seconds()/elapsed.Seconds(), "broker-core-%")
		b.ReportMetric(float64(xacts)/elapsed.Seconds(), "pg-xact/s")
		b.ReportMetric(float64(procPeakRSS(b, strconv.Itoa(pid)))/(1<<20), "peak-MiB")
		b.ReportMetric(float64(procStatus(b, strconv.Itoa(pid), "VmRSS:"))/(1<<10), "rss-MiB")
		b.ReportMetric(float64(procStatus(b, strconv.Itoa(pid), "Threads:")), "threads")
		b.ReportMetric(reaperGoroutines(b, admin), "goroutines")
		b.ReportMetric(float64(connsOf(b, server, "")), "pg-conns")
		b.ReportMetric(float64(perOutbox), "pg-conns/outbox")
		b.ReportMetric(float64(tcpConnsTo(b, pid, broker.Addr)), "kafka-conns")
		b.ReportMetric(max(others, 0).Seconds()/elapsed.Seconds(), "other-cores")
		reaper.stop(b)
	}
}

// The idle outboxes' settling time after their records are published, and the window measured
// unless envIdleWindow says otherwise.
const (
	idleOutboxesSettle = 30 * time.Second
	idleOutboxesWindow = 60 * time.Second
)

// envIdleWindow sets BenchmarkIdleOutboxes' window (a Go duration, at least a minute); make bench
// passes IDLE_WINDOW on.
const envIdleWindow = "GOHARVEST_BENCH_IDLE_WINDOW"

func idleWindow(b *testing.B) time.Duration {
	v := os.Getenv(envIdleWindow)
	if v == "" {
		return idleOutboxesWindow
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < time.Minute {
		b.Fatalf("%s=%q: want a duration of at least 1m", envIdleWindow, v)
	}
	return d
}

// idleRuns counts BenchmarkIdleOutboxes' runs in this process, to name each run's outboxes apart.
var idleRuns int

// idleOutbox is one of BenchmarkIdleOutboxes' outboxes.
type idleOutbox struct{ name, dsn, table string }

// idleRows counts the rows of an outbox.
func idleRows(b *testing.B, o idleOutbox) int {
	conn, err := pgx.Connect(context.Background(), o.dsn)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM "+o.table).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}

// idleReaper is the reaper process of BenchmarkIdleOutboxes.
type idleReaper struct {
	cmd  *exec.Cmd
	logs *strings.Builder
	done chan error
}

func startIdleReaper(b *testing.B, bin, config string) *idleReaper {
	r := &idleReaper{cmd: exec.Command(bin, "-f", config), logs: &strings.Builder{}, done: make(chan error, 1)}
	stderr, err := r.cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	lines := make(chan string)
	go func() {
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	go func() {
		for line := range lines {
			fmt.Fprintln(os.Stderr, "reaper:", line) // warnings and errors only (logging.level warn)
		}
		r.done <- r.cmd.Wait()
	}()
	b.Cleanup(func() { r.cmd.Process.Kill() })
	return r
}

// stop sends SIGTERM and fails the benchmark unless the reaper exits 0 within a minute.
func (r *idleReaper) stop(b *testing.B) {
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.done:
		if err != nil {
			b.Errorf("reaper: %v", err)
		}
	case <-time.After(time.Minute):
		b.Error("the reaper did not stop within a minute")
	}
}

// freeBenchAddr returns a loopback address that nothing listens on now.
func freeBenchAddr(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// reaperGoroutines reads go_goroutines from the reaper's /metrics.
func reaperGoroutines(b *testing.B, admin string) float64 {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for line := range strings.Lines(string(body)) {
		if rest, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				b.Fatal(err)
			}
			return n
		}
	}
	b.Fatal("no go_goroutines in the reaper's /metrics")
	return 0
}

// connsOf counts the server's client connections whose application_name is name, or every
// outbox's ("idle-...") when name is empty.
func connsOf(b *testing.B, server *pgcluster.Server, name string) int {
	pattern := name
	if name == "" {
		pattern = "idle-%"
	}
	var n int
	queryAdmin(b, server, "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1", []any{pattern}, &n)
	return n
}

// maxConnsPerOutbox is the most client connections any one outbox holds now.
func maxConnsPerOutbox(b *testing.B, server *pgcluster.Server) int {
	var n int
	queryAdmin(b, server, `SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM pg_stat_activity
		WHERE application_name LIKE 'idle-%' GROUP BY application_name) AS c`, nil, &n)
	return n
}

// committed is the transactions the databases of dsns have committed and rolled back so far.
func committed(b *testing.B, server *pgcluster.Server, dsns []string) int64 {
	var names []string
	for _, dsn := range dsns {
		names = append(names, pgcluster.DatabaseName(dsn))
	}
	var n int64
	queryAdmin(b, server, `SELECT sum(xact_commit + xact_rollback)::bigint FROM pg_stat_database WHERE datname = ANY($1)`, []any{names}, &n)
	return n
}

// queryAdmin runs one query on the server's admin database and scans its one row.
func queryAdmin(b *testing.B, server *pgcluster.Server, sql string, args []any, dest ...any) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, server.AdminDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, sql, args...).Scan(dest...); err != nil {
		b.Fatalf("%s: %v", sql, err)
	}
}

// tcpConnsTo counts the established TCP connections process pid has to addr's port.
func tcpConnsTo(b *testing.B, pid int, addr string) int {
	sockets := map[string]bool{}
	fds, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/fd")
	if err != nil {
		b.Fatal(err)
	}
	for _, fd := range fds {
		link, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/fd/" + fd.Name())
		if inode, ok := strings.CutPrefix(link, "socket:["); err == nil && ok {
			sockets[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var ports []string
	for _, a := range strings.Split(addr, ",") {
		_, port, err := net.SplitHostPort(a)
		if err != nil {
			b.Fatal(err)
		}
		p, _ := strconv.Atoi(port)
		ports = append(ports, fmt.Sprintf(":%04X", p))
	}
	n := 0
	for _, table := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/net/" + table)
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			f := strings.Fields(line) // sl local remote st ... inode (10th)
			if len(f) < 10 || f[3] != "01" || !sockets[f[9]] {
				continue
			}
			for _, p := range ports {
				if strings.HasSuffix(f[2], p) {
					n++
				}
			}
		}
	}
	return n
}
