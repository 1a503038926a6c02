package reaper_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/outbox"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func eventually(t *testing.T, what string, within time.Duration, cond func() (bool, string)) {
	t.Helper()
	var last string
	if !testwait.Until(within, func() (ok bool) { ok, last = cond(); return ok }) {
		t.Fatalf("%s: not within %v; last answer: %s", what, within, last)
	}
}

// ownPostgres starts a Postgres cluster for one test, which may stop it (the shared one must
// stay up), and returns it with a new database's data source.
func ownPostgres(t *testing.T) (*pgcluster.Server, string) {
	t.Helper()
	pg, err := pgcluster.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pg.Stop() })
	dsn, _, err := pg.CreateDatabase()
	if err != nil {
		t.Fatal(err)
	}
	return pg, dsn
}

// runReaper runs the reaper in this process until the returned function stops it, and fails the
// test, with the reaper's output, unless it then exits 0 within 20s.
func runReaper(t *testing.T, config string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- reaper.Main([]string{"-f", config}, reaper.Env{Stdout: &out, Stderr: &out, LookupEnv: os.LookupEnv, Context: ctx})
	}()
	stopped := false
	return func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case code := <-done:
			if code != 0 {
				t.Errorf("the reaper exited %d:\n%s", code, out.String())
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the reaper did not stop:\n%s", out.String())
		}
	}
}

// The reaper serves /healthz, /readyz and /metrics; readiness follows the database down and up,
// while liveness does not.
func TestAdminEndpoints(t *testing.T) {
	pg, dsn := ownPostgres(t)
	if err := postgres.CreateOutboxTable(context.Background(), dsn, "outbox", outbox.TableOptions{}); err != nil {
		t.Fatal(err)
	}
	broker := kafkacluster.Shared(t)
	addr := freeAddr(t)
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	os.WriteFile(config, []byte(`harvest:
  baseKafkaConfig:
    bootstrap.servers: `+broker.Addr()+`
  leaderTopic: admin.leader
  leaderGroupID: admin
  dataSource: "`+dsn+`"
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
admin:
  address: `+addr+`
`), 0o600)
	stop := runReaper(t, config)
	base := "http://" + addr
	status := func(path string, want int) func() (bool, string) {
		return func() (bool, string) {
			code, body := get(base + path)
			return code == want, body
		}
	}
	eventually(t, "healthz 200", 15*time.Second, status("/healthz", 200))
	eventually(t, "readyz 200", 15*time.Second, status("/readyz", 200))
	eventually(t, "metrics", 15*time.Second, func() (bool, string) {
		code, body := get(base + "/metrics")
		return code == 200 && strings.Contains(body, `goharvest_leader{harvest=`) && strings.Contains(body, "go_goroutines") &&
			strings.Contains(body, `goharvest_shard_leader{harvest="`) && strings.Contains(body, `shard="0"} 1`), body[:min(200, len(body))]
	})
	eventually(t, "shards: leads shard 0 of 1", 15*time.Second, func() (bool, string) {
		code, body := get(base + reaper.ShardsPath)
		return code == 200 && strings.Contains(body, `"shards":1`) && strings.Contains(body, `"leads":[{"shard":0,"leaderID":"`), body
	})

	if err := pg.Halt(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "readyz 503 naming the database", 15*time.Second, func() (bool, string) {
		code, body := get(base + "/readyz")
		return code == 503 && strings.Contains(body, "database"), body
	})
	if code, body := get(base + "/healthz"); code != 200 {
		t.Fatalf("the database being down made the reaper unhealthy: %d %s", code, body)
	}
	if err := pg.Resume(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "readyz 200 again", 30*time.Second, status("/readyz", 200))

	stop()
}
