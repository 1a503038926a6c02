package bench_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/outbox"
)

// BenchmarkDrainShards: BenchmarkDrain's backlog (200,000 records over 10,000 keys) drained with
// Shards 1 and 8 by one process, and with 8 shards by two processes that lead 4 each. The second
// harvester runs in a child process (this test binary, re-executed; see serveHarvesterIfChild),
// so that each process's CPU is its own.
//
// Unlike BenchmarkDrain, the harvesters start, and share the shards out, before the backlog
// appears: with two processes the second one's arrival moves half the shards, which would
// otherwise fall inside a drain of a few seconds. The backlog is loaded and vacuumed under
// another name, the harvesters lead every shard of an empty outbox, and the timer starts when one
// transaction swaps the loaded table in (and notifies the harvesters, as a writer's trigger
// would). The rows then report, besides BenchmarkDrain's figures:
//
//	broker-µs/rec      the broker process's CPU per record
//	busy-cores         the CPU of the harvesters, Postgres and the broker over the drain's time
//	other-cores        the CPU the machine's other processes used over the drain's time
//	relayN-cpu-ms      each harvester process's CPU during the drain (two processes)
//	childpeak-MiB      the child harvester's peak resident memory
//	idle-relay-ms/s    the harvesters' and Postgres's CPU per second over 5 s before the
//	idle-pg-ms/s       backlog appears, with every shard led: the fixed cost of the shards
//
// Postgres's planner settings stay at their defaults: each shard's mark is written so that the
// planner walks the shard index at the default random_page_cost of 4 too (see
// outbox.ShardMarkClauses); before it was, only random_page_cost=1.1 made it.
func BenchmarkDrainShards(b *testing.B) {
	b.Run("shards=1", func(b *testing.B) { benchDrainShards(b, 1, 1) })
	b.Run("shards=8", func(b *testing.B) { benchDrainShards(b, 8, 1) })
	b.Run("shards=8/processes=2", func(b *testing.B) { benchDrainShards(b, 8, 2) })
}

// benchDrainShards drains with shards split evenly over processes.
func benchDrainShards(b *testing.B, shards, processes int) {
	const records, keys = 200_000, 10_000
	rig := startBenchRig(b)
	for range b.N {
		run := rig.newRun()
		if shards > 1 {
			run.shardIndex(shards)
		}
		run.loadBacklog(records, keys)
		run.exec("ALTER TABLE outbox RENAME TO outbox_backlog")
		// The copy keeps the shard index, which a sharded harvester's marks use.
		run.exec("CREATE TABLE outbox (LIKE outbox_backlog INCLUDING ALL)")
		run.startHarvester()
		var children []*benchChild
		for range processes - 1 {
			children = append(children, run.startChild())
		}
		run.awaitSpread(children, shards/processes)
		time.Sleep(time.Second) // past the first empty marks
		idle := measureScale(b, rig, children)
		const idleFor = 5 * time.Second
		time.Sleep(idleFor)
		idleRelay, idlePG := idle.rates(b, idleFor)
		run.exec("SELECT pg_stat_statements_reset()")

		b.ResetTimer()
		m := rig.measure()
		cm := measureScale(b, rig, children)
		run.exec(`BEGIN; ALTER TABLE outbox RENAME TO outbox_standby; ALTER TABLE outbox_backlog RENAME TO outbox;
			SELECT pg_notify('` + outbox.NotifyChannel("outbox") + `', ''); COMMIT`)
		testwait.For(b, 10*time.Minute, "the outbox to drain", run.empty)
		m.stop(b, records)
		cm.stop(b, m, records)
		b.StopTimer()
		// Reported only now: ResetTimer drops the metrics reported before it.
		b.ReportMetric(idleRelay, "idle-relay-ms/s")
		b.ReportMetric(idlePG, "idle-pg-ms/s")
		run.reportStatements(records)
		if n := run.rows("outbox_standby"); n != 0 {
			b.Fatalf("%d rows reached the standby outbox", n)
		}
		for _, c := range children {
			c.stop(b)
		}
		run.close()
	}
}

func (r *benchRun) exec(sql string) {
	if _, err := r.pool.Exec(context.Background(), sql); err != nil {
		r.b.Fatalf("%s: %v", sql, err)
	}
}

func (r *benchRun) rows(table string) int {
	var n int
	if err := r.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
		r.b.Fatal(err)
	}
	return n
}

// awaitSpread waits, for at most a minute, until this process and each child lead `each` shards.
func (r *benchRun) awaitSpread(children []*benchChild, each int) {
	spread := func() bool {
		ok := len(r.h.LeadShards()) == each
		for _, c := range children {
			ok = ok && int(c.leads.Load()) == each
		}
		return ok
	}
	if !testwait.Until(time.Minute, spread) {
		r.b.Fatalf("the shards were not spread within a minute: this process leads %d", len(r.h.LeadShards()))
	}
}

// envBenchHarvester tells a re-executed test binary to run a harvester; its value is the
// benchHarvesterConfig as JSON.
const envBenchHarvester = "GOHARVEST_BENCH_HARVESTER"

// serveHarvesterIfChild turns this process into a harvester when startChild started it. It
// prints "leads N" whenever the number of shards it leads changes, and stops the harvester and
// exits once the parent closes its standard input: with status 1 if the harvester failed.
func serveHarvesterIfChild() {
	spec, ok := os.LookupEnv(envBenchHarvester)
	if !ok {
		return
	}
	var c benchHarvesterConfig
	if err := json.Unmarshal([]byte(spec), &c); err != nil {
		fmt.Fprintln(os.Stderr, "bench harvester:", err)
		os.Exit(1)
	}
	cfg, err := c.config()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench harvester:", err)
		os.Exit(1)
	}
	h, err := goharvest.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench harvester:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { io.Copy(io.Discard, os.Stdin); cancel() }()
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	led := -1
	tick := time.NewTicker(10 * time.Millisecond)
	for {
		select {
		case err := <-done:
			if err != nil {
				fmt.Fprintln(os.Stderr, "bench harvester:", err)
				os.Exit(1)
			}
			os.Exit(0)
		case <-tick.C:
			if n := len(h.LeadShards()); n != led {
				led = n
				fmt.Println("leads", n)
			}
		}
	}
}

// benchChild is a harvester of the run's group in a child process.
type benchChild struct {
	cmd   *exec.Cmd
	stdin io.Closer
	leads atomic.Int32
}

func (r *benchRun) startChild() *benchChild {
	spec, err := json.Marshal(r.harvesterConfig())
	if err != nil {
		r.b.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envBenchHarvester+"="+string(spec))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		r.b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		r.b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.b.Fatal(err)
	}
	c := &benchChild{cmd: cmd, stdin: stdin}
	go func() {
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			if n, ok := strings.CutPrefix(s.Text(), "leads "); ok {
				led, _ := strconv.Atoi(n)
				c.leads.Store(int32(led))
			}
		}
	}()
	return c
}

// stop has the child stop its harvester, and fails the benchmark if it does not exit cleanly
// within 30 s.
func (c *benchChild) stop(b *testing.B) {
	c.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			b.Errorf("child harvester: %v", err)
		}
	case <-time.After(30 * time.Second):
		c.cmd.Process.Kill()
		b.Error("child harvester did not stop within 30s")
	}
}

// scaleMeasurement is the CPU of the processes a measurement does not cover: the broker and
// the child harvesters.
type scaleMeasurement struct {
	rig       *benchRig
	children  []*benchChild
	start     time.Time
	relay, pg time.Duration
	broker    time.Duration
	child     []time.Duration
	machine   time.Duration
}

func measureScale(b *testing.B, rig *benchRig, children []*benchChild) *scaleMeasurement {
	m := &scaleMeasurement{rig: rig, children: children, start: time.Now(), relay: processCPU(),
		pg: mustCPU(b, rig.server), broker: rig.broker.cpu(b), machine: machineCPU(b)}
	for _, c := range children {
		m.child = append(m.child, pidCPU(b, c.cmd.Process.Pid))
	}
	return m
}

// used is the CPU the harvester processes, Postgres and the broker used since the measurement
// began, the harvesters' first this process's and then each child's.
func (m *scaleMeasurement) used(b *testing.B) (relays []time.Duration, pg, broker time.Duration) {
	relays = []time.Duration{processCPU() - m.relay}
	for i, c := range m.children {
		relays = append(relays, pidCPU(b, c.cmd.Process.Pid)-m.child[i])
	}
	return relays, mustCPU(b, m.rig.server) - m.pg, m.rig.broker.cpu(b) - m.broker
}

// stop adds to the figures of measurement base (which reports this process's CPU as the relay's)
// the children's, the broker's, and how many cores all of them kept busy.
func (m *scaleMeasurement) stop(b *testing.B, base *measurement, records int) {
	elapsed := time.Since(m.start)
	relays, pg, broker := m.used(b)
	var relay time.Duration
	for _, r := range relays {
		relay += r
	}
	if len(relays) > 1 {
		// Replaces base's figure, which counted this process alone.
		b.ReportMetric(float64(relay.Microseconds())/float64(records), "relay-µs/rec")
		for i, r := range relays {
			b.ReportMetric(float64(r.Milliseconds()), "relay"+strconv.Itoa(i)+"-cpu-ms")
		}
		var peak int64
		for _, c := range m.children {
			peak = max(peak, procPeakRSS(b, strconv.Itoa(c.cmd.Process.Pid)))
		}
		b.ReportMetric(float64(peak)/(1<<20), "childpeak-MiB")
	}
	b.ReportMetric(float64(broker.Microseconds())/float64(records), "broker-µs/rec")
	b.ReportMetric((relay+pg+broker).Seconds()/elapsed.Seconds(), "busy-cores")
	// Other programs on the machine (other tests, say) take cores from the drain: throughput
	// figures mean little unless this is near 0.
	others := machineCPU(b) - m.machine - (relay + pg + broker)
	b.ReportMetric(max(others, 0).Seconds()/elapsed.Seconds(), "other-cores")
}

// rates is the CPU per second, in milliseconds, that the harvesters and Postgres used over the
// d since the measurement began.
func (m *scaleMeasurement) rates(b *testing.B, d time.Duration) (relay, pg float64) {
	relays, pgCPU, _ := m.used(b)
	var sum time.Duration
	for _, r := range relays {
		sum += r
	}
	return float64(sum.Milliseconds()) / d.Seconds(), float64(pgCPU.Milliseconds()) / d.Seconds()
}

// pidCPU is the user and system CPU time a process has used so far (Linux only).
func pidCPU(b *testing.B, pid int) time.Duration {
	cpu, err := pgcluster.ProcessCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return cpu
}

// machineCPU is the CPU time all the machine's cores have spent busy so far, from /proc/stat.
func machineCPU(b *testing.B) time.Duration {
	stat, err := os.ReadFile("/proc/stat")
	if err != nil {
		b.Fatal(err)
	}
	line, _, _ := strings.Cut(string(stat), "\n")
	fields := strings.Fields(line) // cpu user nice system idle iowait irq softirq steal ...
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		n, _ := strconv.ParseInt(fields[i], 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}
