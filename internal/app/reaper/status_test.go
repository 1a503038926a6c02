package reaper_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

// The status page, opened in a real browser (headless Chromium), shows a person what the
// running reaper does: the shard it leads under the leader ID /shards reports, the held row's id,
// key and error, the throughput chart, the log's last errors, the version and the settings
// without their secrets. It loads nothing and reloads itself. With admin.hideKeys the held
// row's key is shown nowhere on the admin port. GOHARVEST_STATUS_SCREENSHOT names where to save
// the screenshot (make status-page-screenshot: docs/status-page.png, which docs/monitoring.md shows).
func TestStatusPageInABrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed (Debian: apt-get install chromium; .ci/run installs it): %v", err)
	}
	ctx := context.Background()
	// Postgres trusts local connections, so the password is never checked; it must never be shown.
	const pgSecret, kafkaSecret = "pg-secret-7f3a", "kafka-secret-91c2"
	dsn := pgtest.NewDatabase(t) + " password=" + pgSecret
	broker := kafkacluster.Shared(t)
	broker.Topic(t, "status.events", 1)
	addr := freeAddr(t)
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	writeConfig := func(hideKeys bool) {
		// librdkafka ignores a SASL password on a plaintext connection, which franz refuses; the
		// page must hide it either way.
		os.WriteFile(config, []byte(fmt.Sprintf(`harvest:
  kafkaClient: librdkafka
  baseKafkaConfig:
    bootstrap.servers: %s
    sasl.password: %s
  leaderTopic: status.leader
  leaderGroupID: status
  dataSource: "%s"
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
    heldCheckInterval: 100ms
    backlogSampleInterval: 200ms
admin:
  address: %s
  hideKeys: %v
`, broker.Addr(), kafkaSecret, dsn, addr, hideKeys)), 0o600)
	}
	writeConfig(false)
	command := func(args ...string) (int, string) {
		var out bytes.Buffer
		code := reaper.Main(append(args, "-f", config), reaper.Env{Stdout: &out, Stderr: &out, LookupEnv: os.LookupEnv, Context: ctx})
		return code, out.String()
	}
	if code, out := command("init"); code != 0 {
		t.Fatalf("init: %d %s", code, out)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var held int64
	err = pool.QueryRow(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
		VALUES (now(), 'no such topic!', 'customer-4711', 'v', '{}', '{}') RETURNING id`).Scan(&held)
	if err != nil {
		t.Fatal(err)
	}
	insert := func(n int) {
		_, err := pool.Exec(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			SELECT now(), 'status.events', 'k' || i, 'v', '{}', '{}' FROM generate_series(1, $1) i`, n)
		if err != nil {
			t.Fatal(err)
		}
	}
	insert(500)
	stop := runReaper(t, config)
	base := "http://" + addr
	eventually(t, "the reaper holds the bad row", 30*time.Second, func() (bool, string) {
		_, body := get(base + reaper.HeldPath)
		return strings.Contains(body, fmt.Sprintf(`"id":%d`, held)), body
	})
	insert(3000) // a second load, for the chart

	var shards struct {
		Leads []struct{ LeaderID string } `json:"leads"`
	}
	_, body := get(base + reaper.ShardsPath)
	if err := json.Unmarshal([]byte(body), &shards); err != nil || len(shards.Leads) != 1 {
		t.Fatalf("/shards: %s (%v)", body, err)
	}
	leaderID := shards.Leads[0].LeaderID

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.WindowSize(1100, 800))...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	// The first run starts the browser, which lives as long as that run's context: no timeout
	// there, only on what follows.
	if err := chromedp.Do(browser, chromedp.Navigate("about:blank")); err != nil {
		t.Fatal(err)
	}
	timed, cancelTimed := context.WithTimeout(browser, 3*time.Minute)
	defer cancelTimed()
	var page struct {
		shards, held, errors, config, text, html, refresh string
		resources                                         int
		points                                            string
	}
	read := func() error {
		if err := chromedp.Do(timed, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.ID("shards"))); err != nil {
			return err
		}
		for _, text := range []struct {
			into *string
			of   chromedp.Action[string]
		}{
			{&page.shards, chromedp.Text(chromedp.ID("shards"))},
			{&page.held, chromedp.Text(chromedp.ID("held"))},
			{&page.errors, chromedp.Text(chromedp.ID("errors"))},
			{&page.config, chromedp.Text(chromedp.ID("config"))},
			{&page.text, chromedp.Text(chromedp.CSS("body"))},
			{&page.html, chromedp.OuterHTML(chromedp.CSS("html"))},
			{&page.refresh, chromedp.Evaluate[string](`document.querySelector('meta[http-equiv="refresh"]').content`)},
			{&page.points, chromedp.Evaluate[string](`document.querySelector('#throughput polygon')?.getAttribute('points') ?? ''`)},
		} {
			var err error
			if *text.into, err = chromedp.Run(timed, text.of); err != nil {
				return err
			}
		}
		var err error
		page.resources, err = chromedp.Run(timed, chromedp.Evaluate[int](`performance.getEntriesByType('resource').length`))
		return err
	}
	// Wait for what a person would wait for: the chart drawn from a few samples, and the load
	// published.
	eventually(t, "the page shows the chart and the load published", 60*time.Second, func() (bool, string) {
		if err := read(); err != nil {
			return false, err.Error()
		}
		return strings.Count(page.points, ",") >= 5 && !strings.Contains(page.text, "peak 0/s"), page.text
	})
	if os.Getenv("GOHARVEST_STATUS_SCREENSHOT") != "" {
		// For the docs' picture, a chart with some history: another load, and half a minute.
		insert(6000)
		eventually(t, "half a minute of chart", time.Minute, func() (bool, string) {
			err := read()
			return err == nil && strings.Count(page.points, ",") >= 30, fmt.Sprint(err)
		})
	}

	row := regexp.MustCompile(`(?m)^\s*0\s+yes\s+` + regexp.QuoteMeta(leaderID))
	if !row.MatchString(page.shards) {
		t.Errorf("the shard table does not show shard 0 led here under %s:\n%s", leaderID, page.shards)
	}
	for _, want := range []string{fmt.Sprint(held), "no such topic!", `"customer-4711"`, "refused by goharvest"} {
		if !strings.Contains(page.held, want) {
			t.Errorf("the held table lacks %q:\n%s", want, page.held)
		}
	}
	if !strings.Contains(page.errors, "holding back its key") || !strings.Contains(page.errors, fmt.Sprintf("id=%d", held)) {
		t.Errorf("the last errors do not show the held row's:\n%s", page.errors)
	}
	for _, want := range []string{"goharvest " + reaper.Version(), "group status", "ready", "leads", "1 of 1", "Published records per second"} {
		if !strings.Contains(page.text, want) {
			t.Errorf("the page lacks %q:\n%s", want, page.text)
		}
	}
	for _, want := range []string{"leaderTopic\tstatus.leader", "heartbeatTimeout\t1s", "baseKafkaConfig.sasl.password\t(set, not shown)",
		"baseKafkaConfig.bootstrap.servers\t" + broker.Addr(), "dataSource\tuser "} {
		if !strings.Contains(page.config, want) {
			t.Errorf("the configuration lacks %q:\n%s", want, page.config)
		}
	}
	for _, secret := range []string{pgSecret, kafkaSecret} {
		if strings.Contains(page.html, secret) {
			t.Errorf("the page shows the secret %q", secret)
		}
	}
	if page.resources != 0 || regexp.MustCompile(`(?i)<script|\ssrc=|<link`).MatchString(page.html) {
		t.Errorf("the page loads %d resources, or would: %s", page.resources, page.html)
	}
	if page.refresh != fmt.Sprint(reaper.StatusRefresh.Seconds()) {
		t.Errorf("meta refresh %q", page.refresh)
	}

	screenshot, err := chromedp.Run(timed, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatal(err)
	}
	if img, err := png.DecodeConfig(bytes.NewReader(screenshot)); err != nil || img.Width < 800 {
		t.Fatalf("screenshot: %v, %+v", err, img)
	}
	path := os.Getenv("GOHARVEST_STATUS_SCREENSHOT")
	if path == "" {
		path = filepath.Join(t.TempDir(), "status-page.png")
	}
	if err := os.WriteFile(path, screenshot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)

	// The page reloads itself: a mark left on the window is gone within the refresh period.
	if _, err := chromedp.Run(timed, chromedp.Evaluate[bool](`window.reloadMark = true`)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the page reloads itself", 3*reaper.StatusRefresh, func() (bool, string) {
		gone, err := chromedp.Run(timed, chromedp.Evaluate[bool](`window.reloadMark === undefined`))
		return err == nil && gone, fmt.Sprint(err)
	})
	cancelBrowser()
	cancelAlloc()
	stop()

	// With admin.hideKeys, neither the page nor /held nor reaper held shows the key.
	writeConfig(true)
	stop = runReaper(t, config)
	defer stop()
	eventually(t, "the restarted reaper holds the bad row", 30*time.Second, func() (bool, string) {
		_, body := get(base + reaper.HeldPath)
		return strings.Contains(body, fmt.Sprintf(`"id":%d`, held)) && strings.Contains(body, `"keysHidden":true`), body
	})
	_, html := get(base + "/")
	_, heldJSON := get(base + reaper.HeldPath)
	_, heldTable := command("held")
	for what, body := range map[string]string{"the page": html, "/held": heldJSON, "reaper held": heldTable} {
		if strings.Contains(body, "customer-4711") {
			t.Errorf("%s shows the key though admin.hideKeys is set:\n%s", what, body)
		}
		if !strings.Contains(body, fmt.Sprint(held)) {
			t.Errorf("%s lacks the held record:\n%s", what, body)
		}
	}
	if !strings.Contains(html, "Keys are hidden") || !strings.Contains(heldTable, "(hidden)") {
		t.Errorf("the page or reaper held does not say keys are hidden:\n%s\n%s", html, heldTable)
	}
}
