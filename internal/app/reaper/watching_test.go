package reaper_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
)

// A real Prometheus scrapes a running reaper and evaluates the rules reaper rules makes for it;
// each fault fires its alert, and the fix resolves it: a held row, the database stopped, the
// only reaper killed. Then every query of the dashboard runs against the same Prometheus and
// must parse and return series, so that a renamed metric breaks the build.
func TestAlertsAndDashboardOnARunningReaper(t *testing.T) {
	ctx := context.Background()
	pg, dsn := ownPostgres(t) // the test stops it
	broker := kafkacluster.Shared(t)
	broker.Topic(t, "watch.events", 1)
	bin := buildReaper(t)
	admin := freeAddr(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "reaper.yaml")
	// Short timings, from which the rules derive short thresholds: a shard unled for 4s (4 x the
	// heartbeat timeout), a record held for 3s (60 x heldCheckInterval).
	os.WriteFile(config, []byte(`harvest:
  baseKafkaConfig:
    bootstrap.servers: `+broker.Addr()+`
  leaderTopic: watch.leader
  leaderGroupID: watch
  dataSource: "`+dsn+`"
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
    heldCheckInterval: 50ms
    backlogSampleInterval: 200ms
admin:
  address: `+admin+`
`), 0o600)
	command := func(args ...string) string {
		out, err := exec.Command(bin, append(args, "-f", config)...).CombinedOutput()
		if err != nil {
			t.Fatalf("reaper %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	command("init")
	rules := filepath.Join(dir, "rules.yaml")
	os.WriteFile(rules, []byte(command("rules", "-sustained", "6s")), 0o600)

	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	run := func(sql string, args ...any) {
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatal(err)
		}
	}
	insert := func(topic, key string, n int) {
		run(`INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			SELECT now(), $1, $2 || i, 'v', '{}', '{}' FROM generate_series(1, $3) i`, topic, key, n)
	}

	r := startWatchedReaper(t, bin, config)
	prom := startPrometheus(t, admin, rules)
	t.Cleanup(func() {
		if t.Failed() {
			for _, q := range []string{"up", "scrape_duration_seconds", "goharvest_reaper_ready", "goharvest_leader"} {
				s, err := prom.query(q)
				t.Logf("%s: %v %v", q, s, err)
			}
			t.Logf("the reaper's log:\n%s", r.out)
		}
	})
	eventually(t, "Prometheus sees shard 0 led", 30*time.Second, func() (bool, string) {
		s, err := prom.query(`goharvest:shard_leaders:sum{group="watch", shard="0"} == 1`)
		return err == nil && len(s) == 1, fmt.Sprint(s, err)
	})
	insert("watch.events", "k", 100)
	eventually(t, "no alert firing on a healthy reaper", 30*time.Second, func() (bool, string) {
		names, err := prom.firing()
		return err == nil && len(names) == 0, fmt.Sprint(names, err)
	})

	parent := t
	t.Run("held row", func(t *testing.T) {
		insert("bad topic!", "held", 1)
		prom.waitAlert(t, "GoharvestHeldRecordTooOld", true, 30*time.Second)
		run(`DELETE FROM outbox WHERE kafka_topic = 'bad topic!'`)
		prom.waitAlert(t, "GoharvestHeldRecordTooOld", false, 30*time.Second)
	})

	t.Run("leader killed with no standby", func(t *testing.T) {
		r.kill()
		prom.waitAlert(t, "GoharvestShardUnled", true, 30*time.Second)
		r = startWatchedReaper(parent, bin, config) // to run past this subtest
		prom.waitAlert(t, "GoharvestShardUnled", false, 30*time.Second)
	})

	t.Run("database stopped", func(t *testing.T) {
		// The new reaper leads before the database goes, so that it is the leader whose marks fail.
		eventually(t, "the new reaper leads", 30*time.Second, func() (bool, string) {
			s, err := prom.query(`goharvest_leader{job="reaper"} == 1`)
			return err == nil && len(s) == 1, fmt.Sprint(s, err)
		})
		if err := pg.Halt(); err != nil {
			t.Fatal(err)
		}
		prom.waitAlert(t, "GoharvestNotReady", true, 45*time.Second)
		prom.waitAlert(t, "GoharvestDatabaseErrors", true, 30*time.Second)
		if err := pg.Resume(); err != nil {
			t.Fatal(err)
		}
		prom.waitAlert(t, "GoharvestNotReady", false, 45*time.Second)
		prom.waitAlert(t, "GoharvestDatabaseErrors", false, 30*time.Second)
	})

	if t.Failed() {
		return // the dashboard's queries need the faults' series, and a running database
	}
	t.Run("dashboard", func(t *testing.T) {
		insert("watch.events", "after", 100) // so that the rates and latencies have recent samples
		checkDashboard(t, prom)
	})
}

// watchedReaper is a reaper process whose output the test may read while it runs.
type watchedReaper struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan struct{}
}

func startWatchedReaper(t *testing.T, bin, config string) *watchedReaper {
	t.Helper()
	r := &watchedReaper{cmd: exec.Command(bin, "-f", config), out: &syncbuf.Buffer{}, done: make(chan struct{})}
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.cmd.Wait(); close(r.done) }()
	t.Cleanup(r.kill)
	return r
}

// kill ends the reaper with SIGKILL: it leaves no election, so a successor waits out its session.
func (r *watchedReaper) kill() {
	r.cmd.Process.Kill()
	<-r.done
}

// dashboard is what the test reads of the Grafana dashboard.
type dashboard struct {
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Query      any    `json:"query"`
			Datasource *struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title      string `json:"title"`
		Type       string `json:"type"`
		Datasource *struct {
			UID string `json:"uid"`
		} `json:"datasource"`
		Targets []struct {
			Expr       string `json:"expr"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
}

var labelValues = regexp.MustCompile(`^label_values\((.+), *(\w+)\)$`)

// checkDashboard runs every panel's query, and each variable's, through prom, Grafana's
// variables replaced as "All" would: each must parse and return at least one series.
func checkDashboard(t *testing.T, prom *promServer) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "monitoring", "goharvest-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	grafana := strings.NewReplacer(`$__rate_interval`, "30s", `$outbox`, ".*", `$harvest`, ".*", `$shard`, ".*")
	queries := map[string]string{} // by where the dashboard holds them
	var variables []string
	for _, v := range d.Templating.List {
		variables = append(variables, v.Name)
		if v.Type != "query" {
			continue
		}
		q, _ := v.Query.(map[string]any)["query"].(string)
		m := labelValues.FindStringSubmatch(q)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, q)
			continue
		}
		queries["variable "+v.Name] = fmt.Sprintf("count by (%s) (%s)", m[2], m[1])
		if v.Datasource == nil || v.Datasource.UID != "${datasource}" {
			t.Errorf("variable %s does not query the data source variable", v.Name)
		}
	}
	for _, want := range []string{"datasource", "outbox", "harvest", "shard"} {
		if !slices.Contains(variables, want) {
			t.Errorf("the dashboard has no variable %s", want)
		}
	}
	panels := 0
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		panels++
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q does not use the data source variable", p.Title)
		}
		for i, target := range p.Targets {
			if target.Datasource.UID != "${datasource}" {
				t.Errorf("panel %q query %d does not use the data source variable", p.Title, i)
			}
			queries[fmt.Sprintf("panel %q query %d", p.Title, i)] = target.Expr
			// A reaper of several outboxes serves a harvester's series under the label outbox;
			// every selector that picks a harvest must pick the outbox too. A reaper of one
			// outbox has no such label, which All (.*) still matches: this reaper's series,
			// queried below, are such.
			if strings.Count(target.Expr, `harvest=~"$harvest"`) != strings.Count(target.Expr, `outbox=~"$outbox", harvest=~"$harvest"`) {
				t.Errorf("panel %q query %d selects a harvest and not its outbox: %s", p.Title, i, target.Expr)
			}
		}
	}
	if panels < 10 {
		t.Fatalf("%d panels; the dashboard lost some", panels)
	}
	eventually(t, "every dashboard query returns series", 30*time.Second, func() (bool, string) {
		var bad []string
		for _, where := range slices.Sorted(maps.Keys(queries)) {
			expr := grafana.Replace(queries[where])
			series, err := prom.query(expr)
			switch {
			case err != nil:
				bad = append(bad, fmt.Sprintf("%s: %v", where, err))
			case len(series) == 0:
				bad = append(bad, fmt.Sprintf("%s: no series for %s", where, expr))
			}
		}
		return len(bad) == 0, strings.Join(bad, "\n")
	})
	t.Logf("%d dashboard queries (%d panels and the variables) returned series", len(queries), panels)
}
