package reaper_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/internal/testkit/verifytest"
	"github.com/goharvest/goharvest/stasher"
)

// testOutbox is one outbox of a reaper under test: its table in a database, and the topic its
// records go to.
type testOutbox struct {
	name, table, topic string
	pool               *pgxpool.Pool
}

// stash writes keys*perKey records of run into the outbox and starts a verifier of what
// arrives; it returns the verifier and the records written, by key.
func (o testOutbox) stash(t *testing.T, broker *kafkacluster.Cluster, run string, keys, perKey int) (*verifytest.Verifier, map[string]int64) {
	t.Helper()
	records, expected := verify.Backlog(o.topic, run, keys, perKey, goharvest.String("v"))
	st, err := stasher.New(o.table)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.StashPgx(context.Background(), o.pool, records...); err != nil {
		t.Fatal(err)
	}
	return verifytest.Start(t, broker.Addr(), o.topic, run), expected
}

func newPool(t *testing.T, dsn string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// One reaper publishes three outboxes over two databases, each in key order; an outbox whose
// table cannot be read holds back only itself, and /readyz names it while the others publish.
func TestReaperPublishesSeveralOutboxes(t *testing.T) {
	broker := kafkacluster.Shared(t)
	dsn1, dsn2 := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	pool1, pool2 := newPool(t, dsn1), newPool(t, dsn2)
	outboxes := []testOutbox{
		{name: "billing", table: "outbox", topic: broker.Topic(t, "multi.billing", 4), pool: pool1},
		{name: "orders", table: "orders_outbox", topic: broker.Topic(t, "multi.orders", 4), pool: pool1},
		{name: "tenant-2", table: "outbox", topic: broker.Topic(t, "multi.tenant2", 4), pool: pool2},
	}
	addr := freeAddr(t)
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	os.WriteFile(config, []byte(`harvest:
  baseKafkaConfig:
    bootstrap.servers: `+broker.Addr()+`
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
outboxes:
  - outbox: billing
    leaderGroupID: multi-billing
    dataSource: "`+dsn1+`"
  - outbox: orders
    leaderGroupID: multi-orders
    dataSource: "`+dsn1+`"
    outboxTable: orders_outbox
    shards: 2
  - outbox: tenant-2
    leaderGroupID: multi-tenant-2
    dataSource: "`+dsn2+`"
admin:
  address: `+addr+`
`), 0o600)

	// reaper init makes every outbox's table.
	var out bytes.Buffer
	if code := reaper.Main([]string{"init", "-f", config}, reaper.Env{Stdout: &out, Stderr: &out, LookupEnv: os.LookupEnv, Context: context.Background()}); code != 0 ||
		strings.Count(out.String(), "is ready") != 3 {
		t.Fatalf("init: exit %d:\n%s", code, out.String())
	}
	const keys, perKey = 20, 25
	verifiers := make([]*verifytest.Verifier, len(outboxes))
	expected := make([]map[string]int64, len(outboxes))
	for i, o := range outboxes {
		verifiers[i], expected[i] = o.stash(t, broker, t.Name()+".1", keys, perKey)
	}

	stop := runReaper(t, config)
	defer stop()
	for i, o := range outboxes {
		verifiers[i].WaitDistinct(t, keys*perKey, time.Minute)
		if report := verifiers[i].Report(expected[i]); !report.OK() {
			t.Fatalf("outbox %s:\n%s", o.name, report)
		}
	}
	base := "http://" + addr
	eventually(t, "readyz 200", 15*time.Second, func() (bool, string) {
		code, body := get(base + reaper.ReadyzPath)
		return code == 200, body
	})
	eventually(t, "metrics labelled by outbox", 15*time.Second, func() (bool, string) {
		_, body := get(base + reaper.MetricsPath)
		for _, o := range outboxes {
			if !strings.Contains(body, `goharvest_leader{harvest="`) || !strings.Contains(body, `outbox="`+o.name+`"} 1`) {
				return false, "no goharvest_leader of outbox " + o.name
			}
		}
		return true, ""
	})
	if code, body := get(base + reaper.HeldPath); code != 404 || !strings.Contains(body, "billing, orders, tenant-2") {
		t.Errorf("/held without an outbox: %d %q, want 404 naming the outboxes", code, body)
	}
	if code, body := get(base + reaper.ShardsPath + "?outbox=orders"); code != 200 || !strings.Contains(body, `"shards":2`) {
		t.Errorf("/shards?outbox=orders: %d %q", code, body)
	}

	// orders' table goes away: its harvester cannot read, and only it stops publishing.
	if _, err := pool1.Exec(context.Background(), "ALTER TABLE orders_outbox RENAME TO orders_outbox_gone"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "readyz 503 naming orders alone", 30*time.Second, func() (bool, string) {
		code, body := get(base + reaper.ReadyzPath)
		return code == 503 && strings.HasPrefix(body, "outbox orders: ") && !strings.Contains(body, "billing") && !strings.Contains(body, "tenant-2"), body
	})
	for _, o := range []int{0, 2} {
		v, want := outboxes[o].stash(t, broker, t.Name()+".2", keys, perKey)
		v.WaitDistinct(t, keys*perKey, time.Minute)
		if report := v.Report(want); !report.OK() {
			t.Fatalf("outbox %s while orders was down:\n%s", outboxes[o].name, report)
		}
	}
	if code, body := get(base + reaper.ReadyzPath + "?outbox=billing"); code != 200 {
		t.Errorf("/readyz?outbox=billing while orders is down: %d %q", code, body)
	}
	// The status page shows the watch's last check, made every second (the heartbeat timeout),
	// not a live one as /readyz is: it may lag /readyz by a second plus a check's own time.
	eventually(t, "status page: one outbox not ready, orders", 10*time.Second, func() (bool, string) {
		code, body := get(base + reaper.StatusPath)
		_, orders, _ := strings.Cut(body, `<a href="/?outbox=orders">orders</a>`)
		orders, _, _ = strings.Cut(orders, "</tr>")
		return code == 200 && strings.Count(body, `<span class="bad">not ready:</span>`) == 1 &&
			strings.Contains(orders, `<span class="bad">not ready:</span>`), body
	})
	if code, body := get(base + reaper.StatusPath + "?outbox=orders"); code != 200 || !strings.Contains(body, `<b class="id">orders</b>`) {
		t.Errorf("orders' status page: %d\n%s", code, body)
	}

	// Back again, orders publishes what was written meanwhile.
	if _, err := pool1.Exec(context.Background(), "ALTER TABLE orders_outbox_gone RENAME TO orders_outbox"); err != nil {
		t.Fatal(err)
	}
	v, want := outboxes[1].stash(t, broker, t.Name()+".3", keys, perKey)
	v.WaitDistinct(t, keys*perKey, time.Minute)
	if report := v.Report(want); !report.OK() {
		t.Fatalf("orders after its table came back:\n%s", report)
	}
	stop()
}

// An outbox whose harvester stops on an error (here Kafka refuses its producer's transaction
// timeout, which only shows when it first leads) stops alone: the others go on publishing,
// /readyz names it, and the reaper exits 1 at SIGTERM, naming it.
func TestReaperOutboxStoppedOnAnErrorLeavesTheOthersRunning(t *testing.T) {
	broker := kafkacluster.Shared(t)
	dsn := pgtest.NewDatabase(t)
	pool := newPool(t, dsn)
	good := testOutbox{name: "good", table: "outbox", topic: broker.Topic(t, "stopped.good", 2), pool: pool}
	addr := freeAddr(t)
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	os.WriteFile(config, []byte(`harvest:
  baseKafkaConfig:
    bootstrap.servers: `+broker.Addr()+`
  dataSource: "`+dsn+`"
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
outboxes:
  - outbox: good
    leaderGroupID: stopped-good
  - outbox: refused
    leaderGroupID: stopped-refused
    outboxTable: refused_outbox
    producerKafkaConfig:
      transaction.timeout.ms: 3600000   # above the broker's transaction.max.timeout.ms (15 minutes)
admin:
  address: `+addr+`
`), 0o600)
	var out bytes.Buffer
	if code := reaper.Main([]string{"init", "-f", config}, reaper.Env{Stdout: &out, Stderr: &out, LookupEnv: os.LookupEnv, Context: context.Background()}); code != 0 {
		t.Fatalf("init: exit %d:\n%s", code, out.String())
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var logs syncbuf.Buffer
	done := make(chan int, 1)
	go func() {
		done <- reaper.Main([]string{"-f", config}, reaper.Env{Stdout: &logs, Stderr: &logs, LookupEnv: os.LookupEnv, Context: ctx})
	}()
	base := "http://" + addr
	eventually(t, "readyz 503 naming the refused outbox as stopped", time.Minute, func() (bool, string) {
		code, body := get(base + reaper.ReadyzPath)
		return code == 503 && strings.HasPrefix(body, "outbox refused: stopped: ") && strings.Contains(body, "transaction") && !strings.Contains(body, "good"), body
	})
	_, body := get(base + reaper.ReadyzPath)
	t.Logf("/readyz: %s", body)
	if code, body := get(base + reaper.HealthzPath); code != 200 {
		t.Errorf("/healthz with one outbox stopped: %d %q; want 200, so that the others are not restarted for it", code, body)
	}
	v, want := good.stash(t, broker, t.Name(), 10, 10)
	v.WaitDistinct(t, 100, time.Minute)
	if report := v.Report(want); !report.OK() {
		t.Fatalf("outbox good beside a stopped one:\n%s", report)
	}
	cancel()
	select {
	case code := <-done:
		if out := logs.String(); code != reaper.ExitFailed || !strings.Contains(out, `reaper: outbox "refused" stopped: `) {
			t.Fatalf("exit %d, want %d and a last line naming the refused outbox:\n%s", code, reaper.ExitFailed, out)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("the reaper did not stop:\n%s", logs.String())
	}
}

// Idle outboxes hold one Postgres connection each, their listener's: an idle leader whose
// notifications cover every write (a trigger notifies) makes no queries, neither marks nor
// backlog samples nor readiness pings, and its pool closes its idle connections
// (postgres.DefaultPoolMaxConnIdleTime). A record written afterwards still wakes its outbox at
// once.
func TestIdleOutboxesHoldOneConnectionEach(t *testing.T) {
	broker := kafkacluster.Shared(t)
	dsn1, dsn2 := pgtest.NewDatabase(t), pgtest.NewDatabase(t)
	pool1, pool2 := newPool(t, dsn1), newPool(t, dsn2)
	outboxes := []testOutbox{
		{name: "idle-a", table: "outbox", topic: broker.Topic(t, "idle.a", 1), pool: pool1},
		{name: "idle-b", table: "b_outbox", topic: broker.Topic(t, "idle.b", 1), pool: pool1},
		{name: "idle-c", table: "outbox", topic: broker.Topic(t, "idle.c", 1), pool: pool2},
	}
	dsns := []string{dsn1, dsn1, dsn2}
	addr := freeAddr(t)
	yaml := `harvest:
  baseKafkaConfig:
    bootstrap.servers: ` + broker.Addr() + `
  limits:
    heartbeatTimeout: 1s
admin:
  address: ` + addr + `
outboxes:
`
	for i, o := range outboxes {
		// The application name tells the outboxes' connections apart in pg_stat_activity.
		yaml += "  - outbox: " + o.name + "\n    leaderGroupID: " + t.Name() + "-" + o.name +
			"\n    outboxTable: " + o.table + "\n    dataSource: \"" + dsns[i] + " application_name=" + o.name + "\"\n"
	}
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	os.WriteFile(config, []byte(yaml), 0o600)
	var out bytes.Buffer
	if code := reaper.Main([]string{"init", "-f", config}, reaper.Env{Stdout: &out, Stderr: &out, LookupEnv: os.LookupEnv, Context: context.Background()}); code != 0 {
		t.Fatalf("init: exit %d:\n%s", code, out.String())
	}
	stop := runReaper(t, config)
	defer stop()
	for _, o := range outboxes {
		v, want := o.stash(t, broker, t.Name()+".1", 1, 1)
		v.WaitDistinct(t, 1, time.Minute)
		if report := v.Report(want); !report.OK() {
			t.Fatalf("outbox %s:\n%s", o.name, report)
		}
	}

	conns := func() (map[string]int, string) {
		rows, err := pool1.Query(context.Background(), `SELECT application_name, count(*) FROM pg_stat_activity
			WHERE application_name LIKE 'idle-%' GROUP BY application_name`)
		if err != nil {
			t.Fatal(err)
		}
		n := map[string]int{}
		for rows.Next() {
			var name string
			var count int
			if err := rows.Scan(&name, &count); err != nil {
				t.Fatal(err)
			}
			n[name] = count
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return n, fmt.Sprint(n)
	}
	oneEach := func() (bool, string) {
		n, say := conns()
		for _, o := range outboxes {
			if n[o.name] != 1 {
				return false, say
			}
		}
		return true, say
	}
	// The pool's connections close once idle for 10s, looked for every 5s.
	eventually(t, "one connection per idle outbox", 30*time.Second, oneEach)
	// And stay one: nothing polls.
	var say string
	if !testwait.Throughout(5*time.Second, 500*time.Millisecond, func() (ok bool) { ok, say = oneEach(); return ok }) {
		t.Fatalf("connections per outbox after they idled: %s, want 1 each", say)
	}
	if code, body := get("http://" + addr + reaper.ReadyzPath); code != 200 {
		t.Errorf("/readyz of idle outboxes: %d %q", code, body)
	}
	if ok, say := oneEach(); !ok {
		t.Errorf("connections per outbox after /readyz: %s, want 1 each", say)
	}

	// A record wakes its idle outbox through its notification, not a poll.
	began := time.Now()
	v, want := outboxes[1].stash(t, broker, t.Name()+".2", 1, 1)
	v.WaitDistinct(t, 1, 10*time.Second)
	if report := v.Report(want); !report.OK() {
		t.Fatalf("outbox %s after idling:\n%s", outboxes[1].name, report)
	}
	t.Logf("a record written to an idle outbox arrived after %v", time.Since(began).Round(time.Millisecond))
	stop()
}
