package reaper_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/internal/testkit/verifytest"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// steadyWriter writes a few keys' records into one outbox, a transaction every interval, until
// stopped: the load under which a reload must lose nothing and keep each key's order.
type steadyWriter struct {
	o        testOutbox
	run      string
	keys     int
	written  sync.Map // key → int64, the records committed (their seqs are 0 to this less one)
	total    chan int64
	cancel   context.CancelFunc
	finished chan error
}

func startWriter(t *testing.T, o testOutbox, run string, keys int, interval time.Duration) *steadyWriter {
	t.Helper()
	st, err := stasher.New(o.table)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &steadyWriter{o: o, run: run, keys: keys, cancel: cancel, finished: make(chan error, 1)}
	go func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for seq := int64(0); ; seq++ {
			records := make([]outbox.Record, keys)
			for k := range keys {
				records[k] = verify.Record(o.topic, fmt.Sprintf("k%d", k), run, seq, goharvest.String("v"))
			}
			if err := st.StashPgx(ctx, o.pool, records...); err != nil {
				if ctx.Err() != nil {
					w.finished <- nil
				} else {
					w.finished <- fmt.Errorf("writer of outbox %s: %w", o.name, err)
				}
				return
			}
			for k := range keys {
				w.written.Store(fmt.Sprintf("k%d", k), seq+1)
			}
			select {
			case <-ctx.Done():
				w.finished <- nil
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(cancel)
	return w
}

// count is how many records the writer has committed so far.
func (w *steadyWriter) count() int64 {
	var n int64
	w.written.Range(func(_, seq any) bool { n += seq.(int64); return true })
	return n
}

// stop ends the writes and returns the records written, by key.
func (w *steadyWriter) stop(t *testing.T) map[string]int64 {
	t.Helper()
	w.cancel()
	if err := <-w.finished; err != nil {
		t.Fatal(err)
	}
	expected := map[string]int64{}
	w.written.Range(func(key, seq any) bool { expected[key.(string)] = seq.(int64); return true })
	return expected
}

// reloadingReaper is a reaper run in this process that a test can ask to reload (as SIGHUP
// would).
type reloadingReaper struct {
	logs   syncbuf.Buffer
	reload chan os.Signal
	cancel context.CancelFunc
	done   chan int
}

func startReloadingReaper(t *testing.T, config string) *reloadingReaper {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &reloadingReaper{reload: make(chan os.Signal), cancel: cancel, done: make(chan int, 1)}
	go func() {
		r.done <- reaper.Main([]string{"-f", config}, reaper.Env{Stdout: &r.logs, Stderr: &r.logs, LookupEnv: os.LookupEnv,
			Context: ctx, Reload: r.reload})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(20 * time.Second):
		}
	})
	return r
}

// reloadAndWait asks for a reload and waits for its outcome in the log: the line it ends with,
// "configuration reloaded" or "reload refused", which it returns.
func (r *reloadingReaper) reloadAndWait(t *testing.T) string {
	t.Helper()
	before := strings.Count(r.logs.String(), "configuration reloaded") + strings.Count(r.logs.String(), "reload refused")
	select {
	case r.reload <- syscall.SIGHUP:
	case <-time.After(10 * time.Second):
		t.Fatalf("the reaper took no reload request within 10s:\n%s", r.logs.String())
	}
	var line string
	testwait.For(t, time.Minute, "the reload's outcome in the log", func() bool {
		logs := r.logs.String()
		if strings.Count(logs, "configuration reloaded")+strings.Count(logs, "reload refused") == before {
			return false
		}
		lines := strings.Split(strings.TrimSpace(logs), "\n")
		for i := len(lines) - 1; i >= 0; i-- {
			if strings.Contains(lines[i], "configuration reloaded") || strings.Contains(lines[i], "reload refused") {
				line = lines[i]
				break
			}
		}
		return true
	})
	return line
}

// stopAndExpect stops the reaper and fails the test unless it exits with code.
func (r *reloadingReaper) stopAndExpect(t *testing.T, code int) {
	t.Helper()
	r.cancel()
	select {
	case got := <-r.done:
		if got != code {
			t.Fatalf("the reaper exited %d, want %d:\n%s", got, code, r.logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the reaper did not stop within 20s:\n%s", r.logs.String())
	}
}

// leaderOf returns the leader ID under which this reaper publishes the outbox's shard 0 (a new
// one for each epoch, so a harvester restarted by a reload shows a new one), or "".
func leaderOf(base, name string) string {
	code, body := get(base + reaper.ShardsPath + "?outbox=" + name)
	if code != 200 {
		return ""
	}
	var report struct {
		Leads []struct {
			Shard    int    `json:"shard"`
			LeaderID string `json:"leaderID"`
		} `json:"leads"`
	}
	if json.Unmarshal([]byte(body), &report) != nil || len(report.Leads) == 0 {
		return ""
	}
	return report.Leads[0].LeaderID
}

// reloadConfig is a reaper file listing the named outboxes, each in its own table of one
// database, publishing to the topics given, with extra YAML added to the entries named.
func reloadConfig(t *testing.T, path, brokerAddr, dsn, admin string, names []string, extra map[string]string) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "harvest:\n  baseKafkaConfig:\n    bootstrap.servers: %s\n  dataSource: %q\n  limits:\n    heartbeatTimeout: 1s\n    minPollInterval: 50ms\noutboxes:\n", brokerAddr, dsn)
	for _, name := range names {
		fmt.Fprintf(&b, "  - outbox: %s\n    outboxTable: %s_outbox\n    leaderGroupID: reload-%s\n%s", name, name, name, extra[name])
	}
	fmt.Fprintf(&b, "admin:\n  address: %s\n", admin)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// A reload under load that removes five outboxes, adds five and changes one: the removed stop
// publishing, the added publish everything written to them before and after, the changed one
// restarts, and the others run on untouched (the same leader, the same epoch), with nothing lost
// and every key in order in each. A file that does not load changes nothing.
func TestReaperReloadAddsAndRemovesOutboxesUnderLoad(t *testing.T) {
	broker := kafkacluster.Shared(t)
	dsn := pgtest.NewDatabase(t)
	pool := newPool(t, dsn)
	var kept, removed, added []string
	for i := range 5 {
		kept = append(kept, fmt.Sprintf("kept%d", i))
		removed = append(removed, fmt.Sprintf("removed%d", i))
		added = append(added, fmt.Sprintf("added%d", i))
	}
	outboxes := map[string]testOutbox{}
	for _, name := range append(append(append([]string{}, kept...), removed...), added...) {
		outboxes[name] = testOutbox{name: name, table: name + "_outbox", topic: broker.Topic(t, "reload."+name, 2), pool: pool}
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "reaper.yaml")
	addr := freeAddr(t)
	base := "http://" + addr
	before := append(append([]string{}, kept...), removed...)
	after := append(append([]string{}, kept...), added...)
	changed := map[string]string{"kept0": "    limits:\n      maxInFlightRecords: 5000\n"}
	// Every table exists from the start, so that the writers load every outbox throughout.
	for _, names := range [][]string{before, after} {
		reloadConfig(t, config, broker.Addr(), dsn, addr, names, nil)
		var out bytes.Buffer
		if code := reaper.Main([]string{"init", "-f", config}, reaper.Env{Stdout: &out, Stderr: &out, LookupEnv: os.LookupEnv, Context: context.Background()}); code != 0 {
			t.Fatalf("init: exit %d:\n%s", code, out.String())
		}
	}
	reloadConfig(t, config, broker.Addr(), dsn, addr, before, nil)

	writers := map[string]*steadyWriter{}
	verifiers := map[string]*verifytest.Verifier{}
	for name, o := range outboxes {
		writers[name] = startWriter(t, o, t.Name(), 3, 100*time.Millisecond)
		verifiers[name] = verifytest.Start(t, broker.Addr(), o.topic, t.Name())
	}
	r := startReloadingReaper(t, config)
	for _, name := range before {
		eventually(t, "outbox "+name+" publishes", time.Minute, func() (bool, string) {
			return verifiers[name].Distinct() > 0 && leaderOf(base, name) != "", fmt.Sprintf("%d arrived", verifiers[name].Distinct())
		})
	}
	leaders := map[string]string{}
	for _, name := range kept {
		leaders[name] = leaderOf(base, name)
	}

	// A file that does not load changes nothing, and the log names the mistake.
	os.WriteFile(config, []byte("harvest:\n  limits:\n    heartbeatTimout: 5s\noutboxes:\n  - outbox: x\n"), 0o600)
	if line := r.reloadAndWait(t); !strings.Contains(line, "reload refused") || !strings.Contains(line, "heartbeatTimout") {
		t.Fatalf("reload of a bad file: %s, want it refused naming heartbeatTimout", line)
	}
	// So does a file in which an added outbox does not validate, even though the others do.
	reloadConfig(t, config, broker.Addr(), dsn, addr, after, map[string]string{"added4": "    shards: -1\n"})
	if line := r.reloadAndWait(t); !strings.Contains(line, "reload refused") || !strings.Contains(line, "added4") || !strings.Contains(line, "shards") {
		t.Fatalf("reload with an invalid outbox: %s, want it refused naming added4's shards", line)
	}
	for _, name := range before {
		if code, body := get(base + reaper.ShardsPath + "?outbox=" + name); code != 200 {
			t.Fatalf("after refused reloads, outbox %s: /shards %d %s", name, code, body)
		}
	}

	reloadConfig(t, config, broker.Addr(), dsn, addr, after, changed)
	line := r.reloadAndWait(t)
	if !strings.Contains(line, "configuration reloaded") {
		t.Fatalf("reload: %s\n%s", line, r.logs.String())
	}
	t.Logf("%s", line)
	writtenAtReload := map[string]int64{}
	for _, name := range removed {
		writtenAtReload[name] = writers[name].count()
	}
	for _, name := range removed {
		if code, body := get(base + reaper.ShardsPath + "?outbox=" + name); code != 404 {
			t.Errorf("removed outbox %s: /shards %d %s, want 404", name, code, body)
		}
	}
	eventually(t, "readyz 200 with the new outboxes", time.Minute, func() (bool, string) {
		code, body := get(base + reaper.ReadyzPath)
		return code == 200, body
	})
	for _, name := range after {
		eventually(t, "outbox "+name+" leads", time.Minute, func() (bool, string) { return leaderOf(base, name) != "", "" })
	}
	// Let the load run on past the reload before it stops.
	for _, name := range after {
		n := verifiers[name].Distinct()
		eventually(t, "outbox "+name+" publishes after the reload", time.Minute, func() (bool, string) {
			return verifiers[name].Distinct() > n+30, fmt.Sprintf("%d arrived", verifiers[name].Distinct())
		})
	}
	for name, w := range writers {
		expected := w.stop(t)
		if !strings.HasPrefix(name, "removed") {
			var total int64
			for _, n := range expected {
				total += n
			}
			verifiers[name].WaitDistinct(t, total, time.Minute)
			if report := verifiers[name].Report(expected); !report.OK() {
				t.Errorf("outbox %s:\n%s", name, report)
			}
		}
	}
	for _, name := range kept[1:] {
		if got := leaderOf(base, name); got != leaders[name] {
			t.Errorf("outbox %s, unchanged in the file, changed leader at the reload: %s, then %s", name, leaders[name], got)
		}
	}
	if got := leaderOf(base, "kept0"); got == leaders["kept0"] {
		t.Errorf("outbox kept0, changed in the file, kept its leader %s across the reload: not restarted", got)
	}
	for _, name := range removed {
		var left int64
		pool.QueryRow(context.Background(), "SELECT count(*) FROM "+name+"_outbox").Scan(&left)
		total := writers[name].count()
		if got := verifiers[name].Distinct(); got > writtenAtReload[name] || left < total-writtenAtReload[name] {
			t.Errorf("removed outbox %s went on publishing: %d of its records arrived, %d were written by the reload; %d of %d left in its table",
				name, got, writtenAtReload[name], left, total)
		}
	}
	r.stopAndExpect(t, reaper.ExitOK)
}

// An outbox that stopped on an error starts again at a reload once the file is fixed, while the
// other runs on untouched; the reaper then exits 0, as nothing is stopped.
func TestReaperReloadRestartsAnOutboxStoppedOnAnError(t *testing.T) {
	broker := kafkacluster.Shared(t)
	dsn := pgtest.NewDatabase(t)
	pool := newPool(t, dsn)
	names := []string{"good", "refused"}
	outboxes := map[string]testOutbox{}
	for _, name := range names {
		outboxes[name] = testOutbox{name: name, table: name + "_outbox", topic: broker.Topic(t, "restart."+name, 2), pool: pool}
	}
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	addr := freeAddr(t)
	base := "http://" + addr
	// Above the broker's transaction.max.timeout.ms, which only shows when the outbox first leads.
	refused := map[string]string{"refused": "    producerKafkaConfig:\n      transaction.timeout.ms: 3600000\n"}
	reloadConfig(t, config, broker.Addr(), dsn, addr, names, refused)
	var out bytes.Buffer
	if code := reaper.Main([]string{"init", "-f", config}, reaper.Env{Stdout: &out, Stderr: &out, LookupEnv: os.LookupEnv, Context: context.Background()}); code != 0 {
		t.Fatalf("init: exit %d:\n%s", code, out.String())
	}
	r := startReloadingReaper(t, config)
	eventually(t, "readyz naming refused as stopped", time.Minute, func() (bool, string) {
		code, body := get(base + reaper.ReadyzPath)
		return code == 503 && strings.HasPrefix(body, "outbox refused: stopped: "), body
	})
	eventually(t, "good leads", time.Minute, func() (bool, string) { return leaderOf(base, "good") != "", "" })
	good := leaderOf(base, "good")
	v, want := outboxes["refused"].stash(t, broker, t.Name(), 10, 10)

	reloadConfig(t, config, broker.Addr(), dsn, addr, names, nil)
	if line := r.reloadAndWait(t); !strings.Contains(line, "configuration reloaded") || !strings.Contains(line, "restarted=[refused]") {
		t.Fatalf("reload: %s, want refused restarted", line)
	}
	v.WaitDistinct(t, 100, time.Minute)
	if report := v.Report(want); !report.OK() {
		t.Fatalf("outbox refused after the reload:\n%s", report)
	}
	eventually(t, "readyz 200", time.Minute, func() (bool, string) {
		code, body := get(base + reaper.ReadyzPath)
		return code == 200, body
	})
	if got := leaderOf(base, "good"); got != good {
		t.Errorf("outbox good changed leader at the reload: %s, then %s", good, got)
	}
	r.stopAndExpect(t, reaper.ExitOK)
}
