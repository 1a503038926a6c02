package main

import (
	"context"
	"debug/buildinfo"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// walkthrough holds the commands of docs/getting-started.md's "Try it on your machine", which
// TestDevStack runs as written, each in a shell that has sourced bin/dev.env, from a directory
// holding bin/ as make dev leaves it.
var walkthrough = struct {
	version, init, reaper, insert, consume, pump string
}{
	version: `bin/reaper --version`,
	init:    `bin/reaper init -f bin/dev-reaper.yaml`,
	reaper:  `bin/reaper -f bin/dev-reaper.yaml`,
	insert: `psql "$GOHARVEST_DEV_DSN" -c "INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
  VALUES (now(), 'greetings', 'order-1', 'hello, Kafka', '{}', '{}')"`,
	consume: `bin/devstack consume -n 1 greetings`,
	pump:    `bin/pump -dsn "$GOHARVEST_DEV_DSN" -brokers "$GOHARVEST_DEV_BROKERS" -records 1000 -keys 10 -verify`,
}

// TestDevStack runs make dev's program as a user does: it waits for the exports it prints, checks
// that Postgres answers and that Kafka takes a message and gives it back, follows the
// getting-started walkthrough (a reaper publishing a row, read back from Kafka), then sends
// SIGINT and checks that the program exits 0 with neither server's process left.
func TestDevStack(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "getting-started.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, quoted := range []string{"make dev", walkthrough.version, walkthrough.init, walkthrough.reaper,
		walkthrough.insert, walkthrough.consume, walkthrough.pump, indent(reaperYAML)} {
		if !strings.Contains(string(doc), quoted) {
			t.Errorf("docs/getting-started.md does not show, as the test runs it:\n%s", quoted)
		}
	}

	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	// -buildvcs=auto, whatever GOFLAGS says: the reaper names its commit when Go records it.
	build := exec.Command("go", "build", "-buildvcs=auto", "-o", bin+string(filepath.Separator),
		"github.com/goharvest/goharvest/cmd/reaper", "github.com/goharvest/goharvest/cmd/pump",
		"github.com/goharvest/goharvest/cmd/devstack")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	stack := startStack(t, dir)
	dsn, brokers := stack.export(t, envDSN), stack.export(t, envBrokers)
	env, err := os.ReadFile(filepath.Join(bin, envFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{"export " + envDSN + "=" + shellQuote(dsn), "export " + envBrokers + "=" + shellQuote(brokers)} {
		if !strings.Contains(string(env), line+"\n") {
			t.Errorf("bin/%s lacks %q:\n%s", envFile, line, env)
		}
	}
	if yaml, err := os.ReadFile(filepath.Join(bin, reaperFile)); err != nil || string(yaml) != reaperYAML {
		t.Errorf("bin/%s: %v\n%s", reaperFile, err, yaml)
	}

	postmaster := checkPostgres(t, dsn)
	kafkaPID := stack.child(t, "kafka.Kafka")
	checkKafka(t, brokers)

	t.Run("walkthrough", func(t *testing.T) { followWalkthrough(t, dir) })

	// Ctrl-C.
	if err := stack.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stack.exited:
	case <-time.After(2 * time.Minute):
		t.Fatalf("devstack did not exit within 2 minutes of SIGINT:\n%s", stack.out.String())
	}
	if stack.err != nil {
		t.Fatalf("devstack exited with %v after SIGINT:\n%s", stack.err, stack.out.String())
	}
	// Checked at once: the program has returned, so it must have stopped both servers.
	for what, pid := range map[string]int{"PostgreSQL's postmaster": postmaster, "Kafka": kafkaPID} {
		if running(pid) {
			t.Errorf("%s (PID %d) still runs after devstack exited", what, pid)
		}
	}
	for what, addr := range map[string]string{"PostgreSQL": "127.0.0.1:" + dsnPort(t, dsn), "Kafka": brokers} {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			t.Errorf("%s's address %s still accepts connections after devstack exited", what, addr)
		}
	}
	for _, file := range []string{envFile, reaperFile} {
		if _, err := os.Stat(filepath.Join(bin, file)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("bin/%s is still there after devstack exited (%v): its addresses are gone", file, err)
		}
	}
}

// followWalkthrough runs getting-started's commands: a reaper started, a row inserted with psql
// and read back from Kafka, a load from the pump checked, the reaper stopped with Ctrl-C.
func followWalkthrough(t *testing.T, dir string) {
	out, err := shell(dir, walkthrough.version)
	if err != nil || out != "reaper "+wantReaperVersion(t, filepath.Join(dir, "bin", "reaper"))+"\n" {
		t.Errorf("%s: %v: %q, want %q", walkthrough.version, err, out, "reaper "+wantReaperVersion(t, filepath.Join(dir, "bin", "reaper"))+"\n")
	}
	if out, err := shell(dir, walkthrough.init); err != nil || !strings.Contains(out, "outbox table outbox is ready") {
		t.Fatalf("%s: %v\n%s", walkthrough.init, err, out)
	}

	var reaperOut syncbuf.Buffer
	reaper := exec.Command("bash", "-c", ". bin/dev.env && exec "+walkthrough.reaper)
	reaper.Dir, reaper.Stdout, reaper.Stderr = dir, &reaperOut, &reaperOut
	if err := reaper.Start(); err != nil {
		t.Fatal(err)
	}
	reaperDone := make(chan error, 1)
	go func() { reaperDone <- reaper.Wait() }()
	stopped := false
	defer func() {
		if !stopped {
			reaper.Process.Kill()
			<-reaperDone
			t.Logf("reaper's output:\n%s", reaperOut.String())
		}
	}()

	if out, err := shell(dir, walkthrough.insert); err != nil || !strings.Contains(out, "INSERT 0 1") {
		t.Fatalf("%s: %v\n%s", walkthrough.insert, err, out)
	}
	if out, err := shell(dir, walkthrough.consume); err != nil ||
		!strings.Contains(out, `greetings[0]@0 key "order-1" value "hello, Kafka"`) {
		t.Fatalf("%s: %v\n%s", walkthrough.consume, err, out)
	}
	if out, err := shell(dir, walkthrough.pump); err != nil || !strings.Contains(out, "verdict: OK") {
		t.Fatalf("%s: %v\n%s", walkthrough.pump, err, out)
	}

	// Ctrl-C in the reaper's shell.
	reaper.Process.Signal(syscall.SIGINT)
	select {
	case err := <-reaperDone:
		stopped = true
		if err != nil {
			t.Fatalf("the reaper exited with %v at SIGINT:\n%s", err, reaperOut.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("the reaper did not stop within a minute of SIGINT")
	}
}

// shell runs a walkthrough command as a user in a second shell does, after . bin/dev.env, and
// returns its output. A command that outlasts two minutes is ended.
func shell(dir, command string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", ". bin/dev.env && "+command)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// wantReaperVersion is what reaper --version should print for the binary at path: Version, with
// the commit Go recorded in the binary when Version is a development version. In a clone (.git a
// directory, where go build records the commit), the binary must name the checkout's commit;
// in a git worktree Go records none.
func wantReaperVersion(t *testing.T, path string) string {
	t.Helper()
	info, err := buildinfo.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	if root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output(); err == nil {
		if st, err := os.Stat(filepath.Join(strings.TrimSpace(string(root)), ".git")); err == nil && st.IsDir() {
			head, err := exec.Command("git", "rev-parse", "HEAD").Output()
			if err != nil {
				t.Fatal(err)
			}
			if settings["vcs.revision"] != strings.TrimSpace(string(head)) {
				t.Errorf("the reaper built in a git clone records commit %q; HEAD is %s", settings["vcs.revision"], head)
			}
		}
	}
	v := goharvest.Version
	if !strings.HasSuffix(v, "-dev") || settings["vcs.revision"] == "" {
		return v
	}
	v += "+" + settings["vcs.revision"][:12]
	if settings["vcs.modified"] == "true" {
		v += ".dirty"
	}
	return v
}

// stack is a running devstack.
type stack struct {
	cmd    *exec.Cmd
	out    syncbuf.Buffer
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

// startStack starts dir/bin/devstack from dir, as make dev does, and waits until it is ready. If
// the test ends with it still running, it is stopped (SIGTERM, then SIGKILL).
func startStack(t *testing.T, dir string) *stack {
	s := &stack{cmd: exec.Command(filepath.Join(dir, "bin", "devstack")), exited: make(chan struct{})}
	s.cmd.Dir, s.cmd.Stdout, s.cmd.Stderr = dir, &s.out, &s.out
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { s.err = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		select {
		case <-s.exited:
			return
		default:
		}
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(time.Minute):
			s.cmd.Process.Kill()
			<-s.exited
		}
		t.Logf("devstack's output:\n%s", s.out.String())
	})
	var exitedEarly bool
	testwait.For(t, 4*time.Minute, "devstack to print Ready", func() bool {
		select {
		case <-s.exited:
			exitedEarly = true
			return true
		default:
		}
		return strings.Contains(s.out.String(), "\nReady.")
	})
	if exitedEarly {
		t.Fatalf("devstack exited (%v) before it was ready:\n%s", s.err, s.out.String())
	}
	return s
}

// export returns the value devstack printed for variable name (export NAME='value').
func (s *stack) export(t *testing.T, name string) string {
	t.Helper()
	m := regexp.MustCompile(`(?m)^  export ` + name + `='([^']*)'$`).FindStringSubmatch(s.out.String())
	if m == nil {
		t.Fatalf("devstack printed no export of %s:\n%s", name, s.out.String())
	}
	return m[1]
}

// child returns the PID of devstack's child process whose command line holds marker.
func (s *stack) child(t *testing.T, marker string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && parent(pid) == s.cmd.Process.Pid && strings.Contains(string(cmdline), marker) {
			return pid
		}
	}
	t.Fatalf("devstack (PID %d) has no child process running %s", s.cmd.Process.Pid, marker)
	return 0
}

// checkPostgres checks that the database in dsn answers, and returns the PID of its server's
// postmaster: the parent of the connection's backend.
func checkPostgres(t *testing.T, dsn string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("postgres at %q: %v", dsn, err)
	}
	defer conn.Close(ctx)
	var db string
	var backend int
	if err := conn.QueryRow(ctx, "SELECT current_database(), pg_backend_pid()").Scan(&db, &backend); err != nil {
		t.Fatal(err)
	}
	if db != "goharvest_dev" {
		t.Errorf("the DSN's database is %s, want goharvest_dev", db)
	}
	postmaster := parent(backend)
	if postmaster <= 1 {
		t.Fatalf("no postmaster found for backend %d", backend)
	}
	return postmaster
}

// checkKafka checks that Kafka at brokers takes a message and gives it back.
func checkKafka(t *testing.T, brokers string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const topic = "devstack-check"
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic(topic))
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Close()
	if err := producer.ProduceSync(ctx, &kgo.Record{Key: []byte("k"), Value: []byte("ping")}).FirstErr(); err != nil {
		t.Fatalf("produce to Kafka at %s: %v", brokers, err)
	}
	consumer, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	for {
		fetches := consumer.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("consuming %s from Kafka at %s: nothing within a minute", topic, brokers)
		}
		for _, r := range fetches.Records() {
			if string(r.Value) == "ping" {
				return
			}
			t.Fatalf("consumed %q from %s, want ping", r.Value, topic)
		}
	}
}

// parent returns pid's parent's PID, or 0 when pid does not run.
func parent(pid int) int {
	fields := stat(pid)
	if len(fields) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(fields[1])
	return ppid
}

// running reports whether pid is a process that has not exited (a zombie, exited and not yet
// reaped by its parent, does not run).
func running(pid int) bool {
	fields := stat(pid)
	return len(fields) > 0 && fields[0] != "Z"
}

// stat returns the fields of /proc/PID/stat after the command: state, ppid, ...; none when pid
// does not exist.
func stat(pid int) []string {
	data, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil
	}
	_, rest, ok := strings.Cut(string(data), ") ")
	if !ok {
		return nil
	}
	return strings.Fields(rest)
}

// dsnPort is the port in a key=value DSN.
func dsnPort(t *testing.T, dsn string) string {
	t.Helper()
	for _, field := range strings.Fields(dsn) {
		if port, ok := strings.CutPrefix(field, "port="); ok {
			return port
		}
	}
	t.Fatalf("no port in %q", dsn)
	return ""
}
