package reaper

import (
	"bytes"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/mdanchor"
)

// monitoringDir holds what operators install: the rule file, its unit tests, the dashboard.
var monitoringDir = filepath.Join("..", "..", "..", "monitoring")

func defaultSettings() goharvest.Config {
	return goharvest.Config{LeaderGroupID: "g", Logger: slog.New(slog.DiscardHandler)}.WithDefaults()
}

// The shipped rule file is what reaper rules makes for the default settings. Set
// GOHARVEST_UPDATE_MONITORING=1 to write it anew after changing the rules.
func TestRulesFileIsCurrent(t *testing.T) {
	path := filepath.Join(monitoringDir, "goharvest-rules.yaml")
	want := RulesFile(defaultSettings(), DefaultSustained)
	if os.Getenv("GOHARVEST_UPDATE_MONITORING") != "" {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not what reaper rules makes for the defaults; run GOHARVEST_UPDATE_MONITORING=1 go test -run TestRulesFileIsCurrent ./internal/app/reaper", path)
	}
}

// promtool, Prometheus's own checker, accepts the rules, and its unit tests pass: each alert
// fires on the series that should fire it and stays quiet on the others.
func TestPromtoolChecksAndTestsRules(t *testing.T) {
	promtool := tool(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "goharvest-rules.yaml"},
		{"test", "rules", "goharvest-rules.test.yaml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = monitoringDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Every alert has at least one unit test in which it fires and one in which it stays quiet, so
// that a new alert cannot ship untested.
func TestEveryAlertHasFiringAndQuietUnitTests(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(monitoringDir, "goharvest-rules.test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Tests []struct {
			Name          string `yaml:"name"`
			AlertRuleTest []struct {
				AlertName string           `yaml:"alertname"`
				ExpAlerts []map[string]any `yaml:"exp_alerts"`
			} `yaml:"alert_rule_test"`
		} `yaml:"tests"`
	}
	if err := yaml.Unmarshal(data, &file); err != nil {
		t.Fatal(err)
	}
	fires, quiet := map[string]bool{}, map[string]bool{}
	for _, test := range file.Tests {
		for _, c := range test.AlertRuleTest {
			if len(c.ExpAlerts) > 0 {
				fires[c.AlertName] = true
			} else {
				quiet[c.AlertName] = true
			}
		}
	}
	for _, name := range alertNames(AlertRules(defaultSettings(), DefaultSustained)) {
		if !fires[name] {
			t.Errorf("no unit test in which %s fires", name)
		}
		if !quiet[name] {
			t.Errorf("no unit test in which %s stays quiet", name)
		}
	}
}

func alertNames(rules RuleGroups) []string {
	var names []string
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				names = append(names, r.Alert)
			}
		}
	}
	return names
}

// Each alert's runbook_url leads to docs/monitoring.md's section of that name, and that page has
// a runbook for no alert that does not exist.
func TestRunbooksAreDocsSections(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "monitoring.md"))
	if err != nil {
		t.Fatal(err)
	}
	anchors := mdanchor.Anchors(string(page))
	var runbooks []string
	for _, h := range anchors {
		if strings.HasPrefix(h, "Goharvest") {
			runbooks = append(runbooks, h)
		}
	}
	rules := AlertRules(defaultSettings(), DefaultSustained)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			url := r.Annotations["runbook_url"]
			anchor, ok := strings.CutPrefix(url, RunbookBase)
			if _, found := anchors[anchor]; !ok || !found {
				t.Errorf("%s: runbook_url %s leads to no section of docs/monitoring.md", r.Alert, url)
			}
		}
	}
	names := alertNames(rules)
	for _, heading := range runbooks {
		if !slices.Contains(names, heading) {
			t.Errorf("docs/monitoring.md has a runbook for %s, which is no alert", heading)
		}
	}
}

// tool returns the path of a program the test needs; make test runs where .ci/run installed it,
// so a missing one fails the test rather than skipping it.
func tool(t *testing.T, name string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is not installed (Debian: apt-get install %s; .ci/run installs it): %v", name, map[string]string{
			"promtool": "prometheus", "prometheus": "prometheus", "chromium": "chromium"}[name], err)
	}
	return path
}

func TestPromDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		20 * time.Second: "20s", 2 * time.Minute: "2m", 130 * time.Second: "2m10s", 250 * time.Millisecond: "250ms",
		25 * time.Hour: "25h", 0: "0s", 90 * time.Minute: "1h30m",
	} {
		if got := promDuration(d); got != want {
			t.Errorf("promDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// reaper rules prints the rules for the file's settings: here a 2s heartbeat timeout, so a shard
// may go unled for 8s, and a 200ms held-check interval, so a record may be held for 12s.
func TestRulesCommandDerivesFromTheConfig(t *testing.T) {
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	os.WriteFile(config, []byte("harvest:\n  leaderGroupID: g\n  limits:\n    heartbeatTimeout: 2s\n    heldCheckInterval: 200ms\n"), 0o600)
	rules := func(args ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := Main(append([]string{"rules", "-f", config}, args...), Env{Stdout: &stdout, Stderr: &stderr, LookupEnv: os.LookupEnv, Context: t.Context()})
		return code, stdout.String() + stderr.String()
	}
	code, out := rules("-sustained", "30s")
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, out)
	}
	var file RuleGroups
	if err := yaml.Unmarshal([]byte(out), &file); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"GoharvestShardUnled": "8s", "GoharvestDatabaseErrors": "30s", "GoharvestShardLedTwice": "34s"}
	for _, r := range file.Groups[0].Rules {
		if w, ok := want[r.Alert]; ok && r.For != w {
			t.Errorf("%s: for %q, want %q", r.Alert, r.For, w)
		}
		if r.Alert == "GoharvestHeldRecordTooOld" && !strings.HasSuffix(r.Expr, "> 12") {
			t.Errorf("%s: %s, want a threshold of 12s", r.Alert, r.Expr)
		}
	}
	if !strings.Contains(out, "heartbeatTimeout: 2s   heldCheckInterval: 200ms") {
		t.Errorf("the file does not say which settings it was made for:\n%s", out)
	}
	if code, out := rules("-sustained", "0s"); code != ExitUsage || !strings.Contains(out, "-sustained must be positive") {
		t.Errorf("-sustained 0s: exit %d: %s", code, out)
	}
}
