package reaper_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/buildtest"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/internal/testkit/verifytest"
)

func TestMain(m *testing.M) {
	os.Exit(leakcheck.After(pgtest.Run(mariadbtest.Around(kafkacluster.Around(m)))))
}

func buildReaper(t *testing.T) string {
	return buildtest.Binary(t, "github.com/goharvest/goharvest/cmd/reaper")
}

type reaperProcess struct {
	cmd    *exec.Cmd
	stderr *syncbuf.Buffer
	done   chan struct{}
}

func startReaper(t *testing.T, bin string, env []string, args ...string) *reaperProcess {
	t.Helper()
	p := &reaperProcess{cmd: exec.Command(bin, args...), stderr: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stderr = p.stderr
	p.cmd.Stdout = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// stop sends SIGTERM and returns the exit code.
func (p *reaperProcess) stop(t *testing.T) int {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("reaper did not exit within 20s of SIGTERM; output:\n%s", p.stderr)
	}
	return p.cmd.ProcessState.ExitCode()
}

func TestReaperBinaryPublishesAndStopsCleanlyOnSIGTERM(t *testing.T) {
	bin := buildReaper(t)
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	broker := kafkacluster.Shared(t)
	topic := broker.Topic(t, "process.events", 8)
	config := writeConfig(t, broker, "reaper-test", "")
	env := []string{"DATABASE_URL=" + dsn}
	initOutbox(t, bin, env, config)
	const keys, perKey = 200, 100
	pool, expected, v := stashBacklog(t, dsn, broker, topic, keys, perKey)

	first := startReaper(t, bin, env, "-f", config)
	v.WaitDistinct(t, 3000, time.Minute)
	// reaper reload checks the file and sends SIGHUP, which reloads it rather than ending the
	// process; this one has not changed.
	reload := startReaper(t, bin, env, "reload", "-f", config, "-pid", strconv.Itoa(first.cmd.Process.Pid))
	<-reload.done
	if code := reload.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("reaper reload: exit %d: %s", code, reload.stderr)
	}
	testwait.For(t, 30*time.Second, "the reaper to log its reload", func() bool {
		return strings.Contains(first.stderr.String(), `"msg":"configuration reloaded"`)
	})
	if out := first.stderr.String(); !strings.Contains(out, `"unchanged":1`) {
		t.Errorf("a SIGHUP with the file unchanged: want it reloaded with the outbox untouched:\n%s", out)
	}
	if code := first.stop(t); code != 0 {
		t.Fatalf("first reaper exited %d after SIGTERM:\n%s", code, first.stderr)
	}
	var left int
	pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&left)
	if left == 0 {
		t.Fatal("the first reaper finished before SIGTERM; nothing left to test")
	}
	t.Logf("SIGTERM with %d records left", left)

	second := startReaper(t, bin, env, "-f", config)
	v.WaitDistinct(t, keys*perKey, 2*time.Minute)
	testwait.For(t, time.Minute, "the second reaper to empty the outbox", func() bool {
		pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&left)
		return left == 0
	})
	if code := second.stop(t); code != 0 {
		t.Fatalf("second reaper exited %d after SIGTERM:\n%s", code, second.stderr)
	}
	report := v.Report(expected)
	if !report.OK() {
		t.Fatalf("delivery check failed:\n%s", report)
	}
	t.Logf("%d duplicates", report.Duplicates)
	if !strings.Contains(first.stderr.String(), `"msg":"leader acquired"`) {
		t.Errorf("the reaper's JSON log lacks the leader acquired line:\n%s", first.stderr)
	}
}

// writeConfig writes a reaper.yaml into a directory of the test's own and returns its path: the
// harvesters of group on broker and on the database that DATABASE_URL names, with the election's
// quick timings, JSON logs, and extra (indented YAML) under harvest.
func writeConfig(t *testing.T, broker *kafkacluster.Cluster, group, extra string) string {
	t.Helper()
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	err := os.WriteFile(config, []byte(`harvest:
  baseKafkaConfig:
    bootstrap.servers: `+broker.Addr()+`
  leaderTopic: `+group+`.leader
  leaderGroupID: `+group+`
  dataSource: ${DATABASE_URL}
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
`+extra+`logging:
  format: json
`), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	return config
}

// initOutbox runs reaper init with config, failing the test unless it makes the outbox.
func initOutbox(t *testing.T, bin string, env []string, config string) {
	t.Helper()
	p := startReaper(t, bin, env, "init", "-f", config)
	<-p.done
	if code := p.cmd.ProcessState.ExitCode(); code != 0 || !strings.Contains(p.stderr.String(), "is ready") {
		t.Fatalf("reaper init: exit %d: %s", code, p.stderr)
	}
}

// stashBacklog writes keys*perKey records for topic into the outbox of the database at dsn, and
// starts a verifier of what arrives in topic. It returns a pool on the database, closed when the
// test ends, and the records written, by key, for the verifier's report.
func stashBacklog(t *testing.T, dsn string, broker *kafkacluster.Cluster, topic string, keys, perKey int) (*pgxpool.Pool, map[string]int64, *verifytest.Verifier) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	expected := verifytest.StashBacklog(t, pool, topic, t.Name(), keys, perKey, goharvest.String("v"))
	return pool, expected, verifytest.Start(t, broker.Addr(), topic, t.Name())
}

// reaper reload refuses a file that does not load, and then signals nothing.
func TestReaperReloadChecksTheFileFirst(t *testing.T) {
	bin := buildReaper(t)
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	os.WriteFile(config, []byte("harvest:\n  limits:\n    heartbeatTimout: 5s\n"), 0o600)
	// A process that SIGHUP would end, standing for the reaper.
	target := exec.Command("sleep", "60")
	if err := target.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { target.Wait(); close(exited) }()
	t.Cleanup(func() { target.Process.Kill(); <-exited })
	p := startReaper(t, bin, nil, "reload", "-f", config, "-pid", strconv.Itoa(target.Process.Pid))
	<-p.done
	if code := p.cmd.ProcessState.ExitCode(); code != reaper.ExitUsage || !strings.Contains(p.stderr.String(), "heartbeatTimout") {
		t.Fatalf("reaper reload with a bad file: exit %d: %s; want %d naming the key", code, p.stderr, reaper.ExitUsage)
	}
	select {
	case <-exited:
		t.Fatal("reaper reload signalled the process although the file does not load")
	case <-time.After(200 * time.Millisecond):
	}
}

func TestReaperBinaryExitsWithOneLineOnBadConfig(t *testing.T) {
	bin := buildReaper(t)
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	os.WriteFile(config, []byte("harvest:\n  limits:\n    heartbeatTimout: 5s\n"), 0o600)
	p := startReaper(t, bin, nil, "-f", config)
	<-p.done
	out := p.stderr.String()
	if code := p.cmd.ProcessState.ExitCode(); code != 2 || strings.Count(out, "\n") != 1 ||
		!strings.Contains(out, `line 3: unknown key "harvest.limits.heartbeatTimout"`) {
		t.Fatalf("exit %d, output %q", code, out)
	}
}
