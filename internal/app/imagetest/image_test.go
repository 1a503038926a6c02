package imagetest_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/verifytest"
)

// The image's user, as the Containerfile sets it.
const imageUser = "65532:65532"

// imageConfig is the part of `podman image inspect` (or docker's) that the test checks.
type imageConfig struct {
	User       string
	Entrypoint []string
	Cmd        []string
	Labels     map[string]string
}

func TestImageRunsTheReaperFromScratch(t *testing.T) {
	engine := containerEngine(t)
	if os.Geteuid() != 0 {
		t.Fatal("the image test runs the exported reaper with chroot, which needs root; run make test as root (as CI does)")
	}
	root := filepath.Join("..", "..", "..")
	version := fmt.Sprintf("imagetest-%d", os.Getpid())
	image := "localhost/goharvest-reaper-imagetest:" + version

	// Build the image exactly as a user would.
	build := exec.Command("make", "image", "IMAGE="+image, "VERSION="+version, "CONTAINER_ENGINE="+engine)
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make image: %v\n%s", err, out)
	}
	t.Cleanup(func() { exec.Command(engine, "rmi", "--force", image).Run() })

	var cfg imageConfig
	if err := json.Unmarshal(run(t, engine, "image", "inspect", "--format", "{{json .Config}}", image), &cfg); err != nil {
		t.Fatalf("image config: %v", err)
	}
	size := strings.TrimSpace(string(run(t, engine, "image", "inspect", "--format", "{{.Size}}", image)))
	t.Logf("image %s: %s bytes, user %q, entrypoint %q, cmd %q", image, size, cfg.User, cfg.Entrypoint, cfg.Cmd)
	if cfg.User != imageUser {
		t.Errorf("image user %q, want %q (numeric, not root)", cfg.User, imageUser)
	}
	if !slices.Equal(cfg.Entrypoint, []string{"/reaper"}) {
		t.Errorf("entrypoint %q, want [/reaper]", cfg.Entrypoint)
	}
	for key, want := range map[string]string{
		"org.opencontainers.image.source":   "https://github.com/goharvest/goharvest",
		"org.opencontainers.image.version":  version,
		"org.opencontainers.image.licenses": "BSD-3-Clause",
	} {
		if got := cfg.Labels[key]; got != want {
			t.Errorf("label %s = %q, want %q", key, got, want)
		}
	}

	fs := exportFileSystem(t, engine, image)
	checkFileSystem(t, fs)
	i := slices.Index(cfg.Cmd, "-f")
	if i < 0 || i+1 == len(cfg.Cmd) {
		t.Fatalf("the image's command %q names no configuration file (-f)", cfg.Cmd)
	}
	configPath := cfg.Cmd[i+1]

	if out, err := chroot(fs, nil, "/reaper", "--version").CombinedOutput(); err != nil || string(out) != "reaper "+version+"\n" {
		t.Fatalf("reaper --version in the image: %v: %q, want %q", err, out, "reaper "+version+"\n")
	}

	// The throwaway cluster listens on a socket in a directory the chroot cannot see, so this
	// test's cluster also listens on loopback, which the chroot shares (so does the broker).
	dsn := newDatabase(t)
	broker := kafkacluster.Shared(t)
	broker.Topic(t, "events", 4)
	admin := freeAddr(t)
	writeFile(t, filepath.Join(fs, configPath), `harvest:
  baseKafkaConfig:
    bootstrap.servers: ${KAFKA_BOOTSTRAP_SERVERS}
  leaderTopic: imagetest.leader
  leaderGroupID: imagetest
  dataSource: ${DATABASE_URL}
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
admin:
  address: `+admin+`
logging:
  format: json
`)
	env := []string{"DATABASE_URL=" + dsn, "KAFKA_BOOTSTRAP_SERVERS=" + broker.Addr()}

	if out, err := chroot(fs, env, "/reaper", "init", "-f", configPath).CombinedOutput(); err != nil || !strings.Contains(string(out), "is ready") {
		t.Fatalf("reaper init in the image: %v:\n%s", err, out)
	}
	const keys, perKey = 50, 20
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	expected := verifytest.StashBacklog(t, pool, "events", t.Name(), keys, perKey, goharvest.String("v"))
	v := verifytest.Start(t, broker.Addr(), "events", t.Name())

	// Run the image's entrypoint and command, as a container runtime would.
	r := startReaper(t, fs, env, append(slices.Clone(cfg.Entrypoint), cfg.Cmd...)...)
	for _, path := range []string{reaper.HealthzPath, reaper.ReadyzPath} {
		r.waitFor(t, 30*time.Second, path+" answering 200", func() error { return get(admin, path, nil) })
	}
	if uid := processUID(t, r.cmd.Process.Pid); uid != "65532" {
		t.Errorf("the reaper runs as uid %s, want 65532", uid)
	}
	v.WaitDistinct(t, keys*perKey, time.Minute)
	r.waitFor(t, 30*time.Second, "the outbox to empty", outboxEmpty(pool))
	if published := metricValue(t, admin, "goharvest_records_published_total"); published < keys*perKey {
		t.Errorf("goharvest_records_published_total is %v, want at least %d", published, keys*perKey)
	}
	r.stop(t)
	if report := v.Report(expected); !report.OK() {
		t.Fatalf("delivery check failed:\n%s", report)
	}
	if !strings.Contains(r.logs.String(), `"msg":"leader acquired"`) {
		t.Errorf("the reaper's log lacks the leader acquired line:\n%s", r.logs)
	}

	t.Run("TLS", func(t *testing.T) { testTLSBroker(t, fs, dsn) })
}

// make image-binary KAFKA_CLIENT=franz builds the image's reaper without cgo, a C compiler or
// musl: static, stamped with its version, and with the franz client only, so that it refuses
// kafkaClient: librdkafka. It needs no container engine.
func TestImageBinaryWithoutCgo(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "image")
	version := fmt.Sprintf("imagetest-nocgo-%d", os.Getpid())
	// CC names no compiler, so a build that needed one would fail.
	build := exec.Command("make", "--no-print-directory", "image-binary", "KAFKA_CLIENT=franz", "IMAGE_DIR="+dir, "VERSION="+version, "CC=/bin/false")
	build.Dir = filepath.Join("..", "..", "..")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("make image-binary KAFKA_CLIENT=franz: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "reaper")
	checkStatic(t, bin)
	if out, err := exec.Command(bin, "--version").CombinedOutput(); err != nil || string(out) != "reaper "+version+"\n" {
		t.Errorf("reaper --version: %v: %q", err, out)
	}
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	writeFile(t, config, "harvest:\n  kafkaClient: librdkafka\n  leaderGroupID: g\n  leaderTopic: g.leader\n")
	out, err := exec.Command(bin, "-f", config).CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), `"librdkafka" needs cgo, and this program was built without it`) {
		t.Errorf("kafkaClient: librdkafka: %v: %s; want exit 2 and the client refused", err, out)
	}
}

// testTLSBroker checks that the reaper in the image trusts what its CA bundle vouches for, with
// each Kafka client: librdkafka, linked statically, and Go (the franz client) must each find the
// bundle at /etc/ssl/certs/ca-certificates.crt by themselves. The broker serves clients only TLS,
// with a certificate for 127.0.0.1 from a CA of its own, which is appended to the exported
// bundle; without the bundle the reaper never gets ready.
func testTLSBroker(t *testing.T, fs, dsn string) {
	broker := kafkacluster.Start(t, kafkacluster.TLS())
	caPEM, err := os.ReadFile(broker.CAFile())
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := os.OpenFile(filepath.Join(fs, "etc/ssl/certs/ca-certificates.crt"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = bundle.Write(caPEM)
	if err := errors.Join(err, bundle.Close()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, client := range []string{"librdkafka", "franz"} {
		admin := freeAddr(t)
		writeFile(t, filepath.Join(fs, "etc/reaper/tls.yaml"), `harvest:
  kafkaClient: `+client+`
  baseKafkaConfig:
    bootstrap.servers: `+broker.Addr()+`
    security.protocol: SSL
  leaderTopic: imagetest-tls-`+client+`.leader
  leaderGroupID: imagetest-tls-`+client+`
  dataSource: ${DATABASE_URL}
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
admin:
  address: `+admin+`
logging:
  format: json
`)
		r := startReaper(t, fs, []string{"DATABASE_URL=" + dsn}, "/reaper", "-f", "/etc/reaper/tls.yaml")
		r.waitFor(t, 30*time.Second, client+": /readyz answering 200 over TLS", func() error { return get(admin, reaper.ReadyzPath, nil) })
		r.waitFor(t, 30*time.Second, client+": leadership over TLS", func() error {
			if leader := metricValue(t, admin, "goharvest_leader"); leader != 1 {
				return fmt.Errorf("goharvest_leader is %v", leader)
			}
			return nil
		})
		// And it publishes over TLS.
		topic := "events-tls-" + client
		broker.Topic(t, topic, 1)
		if _, err := pool.Exec(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			SELECT now(), $1, 'k' || i, 'v', '{}', '{}' FROM generate_series(1, 10) AS i`, topic); err != nil {
			t.Fatal(err)
		}
		r.waitFor(t, 30*time.Second, client+": the outbox to empty over TLS", outboxEmpty(pool))
		r.stop(t)
	}
}

// outboxEmpty is a check for waitFor: it fails while the outbox has rows.
func outboxEmpty(pool *pgxpool.Pool) func() error {
	return func() error {
		var left int
		if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&left); err != nil {
			return err
		}
		if left > 0 {
			return fmt.Errorf("%d rows left", left)
		}
		return nil
	}
}

// reaperProcess is a reaper running from the exported image.
type reaperProcess struct {
	cmd  *exec.Cmd
	logs *syncbuf.Buffer
	done chan struct{}
}

func startReaper(t *testing.T, fs string, env []string, args ...string) *reaperProcess {
	r := &reaperProcess{cmd: chroot(fs, env, args...), logs: &syncbuf.Buffer{}, done: make(chan struct{})}
	r.cmd.Stdout, r.cmd.Stderr = r.logs, r.logs
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	t.Cleanup(func() { r.cmd.Process.Kill(); <-r.done })
	return r
}

// stop sends SIGTERM and fails the test unless the reaper exits 0 soon after.
func (r *reaperProcess) stop(t *testing.T) {
	t.Helper()
	stopAt := time.Now()
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		t.Fatalf("the reaper did not exit within 20s of SIGTERM; output:\n%s", r.logs)
	}
	if code := r.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("the reaper exited %d after SIGTERM; output:\n%s", code, r.logs)
	}
	t.Logf("exited 0 %v after SIGTERM", time.Since(stopAt).Round(time.Millisecond))
}

// waitFor polls check until it succeeds, failing the test when the reaper exits first or
// within passes.
func (r *reaperProcess) waitFor(t *testing.T, within time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		select {
		case <-r.done:
			t.Fatalf("the reaper exited while waiting for %s; output:\n%s", what, r.logs)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v: %v; output:\n%s", what, within, err, r.logs)
		}
	}
}

// containerEngine returns podman, or docker where podman is missing, and skips the test when
// neither is installed.
func containerEngine(t *testing.T) string {
	for _, name := range []string{"podman", "docker"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skip("neither podman nor docker is installed, so the reaper's image is not built or tested (bash .ci/run installs podman)")
	return ""
}

// exportFileSystem unpacks the image's file system into a new directory, through a container
// that is created but never started.
func exportFileSystem(t *testing.T, engine, image string) string {
	id := strings.TrimSpace(string(run(t, engine, "create", image)))
	defer exec.Command(engine, "rm", "--force", id).Run()
	archive := filepath.Join(t.TempDir(), "fs.tar")
	run(t, engine, "export", "--output", archive, id)
	fs := t.TempDir()
	run(t, "tar", "-x", "-f", archive, "-C", fs)
	// The image's user must be able to reach its files, as it could in a container.
	if err := os.Chmod(fs, 0o755); err != nil {
		t.Fatal(err)
	}
	return fs
}

// checkFileSystem checks what the reaper needs from its image beyond itself: no shared
// libraries, a CA bundle, a name for its user.
func checkFileSystem(t *testing.T, fs string) {
	checkStatic(t, filepath.Join(fs, "reaper"))
	bundle, err := os.ReadFile(filepath.Join(fs, "etc/ssl/certs/ca-certificates.crt"))
	if err != nil || !x509.NewCertPool().AppendCertsFromPEM(bundle) {
		t.Errorf("the image has no CA bundle at /etc/ssl/certs/ca-certificates.crt (%v)", err)
	}
	passwd, err := os.ReadFile(filepath.Join(fs, "etc/passwd"))
	if err != nil || !strings.Contains(string(passwd), ":65532:65532:") {
		t.Errorf("/etc/passwd names no user 65532: %v %q", err, passwd)
	}
}

// checkStatic checks that the executable at path needs no interpreter or shared library.
func checkStatic(t *testing.T, path string) {
	t.Helper()
	bin, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer bin.Close()
	libs, _ := bin.ImportedLibraries()
	for _, p := range bin.Progs {
		if p.Type == elf.PT_INTERP || len(libs) > 0 {
			t.Errorf("%s is not static: interpreter or libraries %q", path, libs)
			break
		}
	}
}

// chroot returns a command that runs args inside fs as the image's user, with only env in its
// environment, as in a container.
func chroot(fs string, env []string, args ...string) *exec.Cmd {
	bin, err := exec.LookPath("chroot")
	if err != nil {
		bin = "/usr/sbin/chroot" // coreutils' place, which a PATH without sbin misses
	}
	cmd := exec.Command(bin, append([]string{"--userspec=" + imageUser, fs}, args...)...)
	cmd.Env = env
	if cmd.Env == nil {
		cmd.Env = []string{}
	}
	return cmd
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v: %s", filepath.Base(name), strings.Join(args, " "), err, &stderr)
	}
	return out
}

// newDatabase returns the DSN of a new database on a cluster that listens on 127.0.0.1, or on
// the server GOHARVEST_TEST_DSN names (which must then be reachable over TCP).
func newDatabase(t *testing.T) string {
	if os.Getenv(pgtest.EnvDSN) != "" {
		return pgtest.NewDatabase(t)
	}
	s, err := pgcluster.StartTCP()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Stop() })
	dsn, _, err := s.CreateDatabase()
	if err != nil {
		t.Fatal(err)
	}
	return dsn
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func writeFile(t *testing.T, path, content string) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// get fetches an admin endpoint and fails unless it answers 200; the body goes to body.
func get(addr, path string, body io.Writer) error {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", path, resp.Status, bytes.TrimSpace(data))
	}
	if body != nil {
		body.Write(data)
	}
	return nil
}

// processUID returns the real user ID of a running process.
func processUID(t *testing.T, pid int) string {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if fields := strings.Fields(line); len(fields) > 1 && fields[0] == "Uid:" {
			return fields[1]
		}
	}
	t.Fatalf("no Uid line in /proc/%d/status", pid)
	return ""
}

// metricValue returns the sum of a metric's samples, as the admin endpoint serves them.
func metricValue(t *testing.T, admin, name string) float64 {
	var text bytes.Buffer
	if err := get(admin, reaper.MetricsPath, &text); err != nil {
		t.Fatal(err)
	}
	var sum float64
	for line := range strings.Lines(text.String()) {
		if strings.HasPrefix(line, name+" ") || strings.HasPrefix(line, name+"{") {
			fields := strings.Fields(line)
			v, _ := strconv.ParseFloat(fields[len(fields)-1], 64)
			sum += v
		}
	}
	return sum
}
