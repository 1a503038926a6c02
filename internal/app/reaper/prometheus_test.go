package reaper_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// promServer is a throwaway Prometheus server scraping one reaper and evaluating rules.
type promServer struct {
	base string
	out  *syncbuf.Buffer
}

// noKeepAlive talks to the test's servers without idle connections, which would outlive the
// tests as goroutines.
var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

// startPrometheus runs Prometheus (make test runs where .ci/run installed it) scraping target
// every second and evaluating rules every second, until the test ends.
func startPrometheus(t *testing.T, target, rules string) *promServer {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus is not installed (Debian: apt-get install prometheus; .ci/run installs it): %v", err)
	}
	dir := t.TempDir()
	config := filepath.Join(dir, "prometheus.yml")
	err = os.WriteFile(config, []byte(fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: reaper
    static_configs:
      - targets: [%q]
`, rules, target)), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	p := &promServer{base: "http://" + addr, out: &syncbuf.Buffer{}}
	cmd := exec.Command(bin, "--config.file="+config, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("prometheus's output:\n%s", p.out)
		}
	})
	if !testwait.Until(30*time.Second, func() bool {
		resp, err := noKeepAlive.Get(p.base + "/-/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}) {
		t.Fatalf("prometheus did not become ready:\n%s", p.out)
	}
	return p
}

// api gets a path of Prometheus's HTTP API and decodes its data into v.
func (p *promServer) api(path string, params url.Values, v any) error {
	resp, err := noKeepAlive.Get(p.base + path + "?" + params.Encode())
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var envelope struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &envelope); err != nil {
		return fmt.Errorf("%s: %s: %w", path, bytes.TrimSpace(body), err)
	}
	if envelope.Status != "success" {
		return fmt.Errorf("%s: %s", path, envelope.Error)
	}
	return json.Unmarshal(envelope.Data, v)
}

type promSeries struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// query runs an instant query and returns its series.
func (p *promServer) query(expr string) ([]promSeries, error) {
	var data struct {
		ResultType string       `json:"resultType"`
		Result     []promSeries `json:"result"`
	}
	if err := p.api("/api/v1/query", url.Values{"query": {expr}}, &data); err != nil {
		return nil, err
	}
	if data.ResultType != "vector" {
		return nil, fmt.Errorf("%s: a %s, not an instant vector", expr, data.ResultType)
	}
	return data.Result, nil
}

type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

func (p *promServer) alerts() ([]promAlert, error) {
	var data struct {
		Alerts []promAlert `json:"alerts"`
	}
	err := p.api("/api/v1/alerts", nil, &data)
	return data.Alerts, err
}

// waitAlert waits until the alert named is firing (firing true) or neither firing nor pending,
// as Prometheus's API tells.
func (p *promServer) waitAlert(t *testing.T, name string, firing bool, within time.Duration) {
	t.Helper()
	want := "resolved"
	if firing {
		want = "firing"
	}
	eventually(t, name+" "+want, within, func() (bool, string) {
		alerts, err := p.alerts()
		if err != nil {
			return false, err.Error()
		}
		state := "resolved"
		for _, a := range alerts {
			if a.Labels["alertname"] == name && state != "firing" {
				state = a.State
			}
		}
		return state == want, fmt.Sprintf("%s is %s; alerts: %v", name, state, alerts)
	})
}

// firing returns the names of the alerts firing now.
func (p *promServer) firing() ([]string, error) {
	alerts, err := p.alerts()
	var names []string
	for _, a := range alerts {
		if a.State == "firing" {
			names = append(names, a.Labels["alertname"])
		}
	}
	return names, err
}
