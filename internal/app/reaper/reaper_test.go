package reaper

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
)

func env(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// loadExample loads examples/<name> with vars for its environment variables.
func loadExample(t *testing.T, name string, vars func(string) (string, bool)) File {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", name))
	if err != nil {
		t.Fatal(err)
	}
	f, err := Load(data, vars)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return f
}

// The example files validate with each Kafka client, on a machine that has the CA file the SASL
// example names (the franz client reads it as it validates; here it is a CA made for the test).
func TestExampleConfigsLoadAndValidate(t *testing.T) {
	vars := env(map[string]string{"DATABASE_URL": "postgres://app@db/billing", "KAFKA_PASSWORD": "s3cret:{x}"})
	caFile := filepath.Join(t.TempDir(), "ca-cert.pem")
	if err := os.WriteFile(caFile, kafkacluster.NewCA(t), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, client := range []KafkaClient{KafkaClientFranz, KafkaClientLibrdkafka} {
		for _, name := range []string{"reaper.yaml", "reaper-sasl.yaml", "reaper-outboxes.yaml"} {
			f := loadExample(t, name, vars)
			for _, o := range f.Outboxes {
				o.Harvest.KafkaClient = client
				if o.Harvest.BaseKafkaConfig["ssl.ca.location"] != nil {
					o.Harvest.BaseKafkaConfig["ssl.ca.location"] = caFile
				}
				if err := o.Harvest.WithDefaults().Validate(); err != nil {
					t.Errorf("%s, %s client: outbox %s: %v", name, client, o.Name, err)
				}
			}
		}
	}
}

func TestLoadExpandsEnvironment(t *testing.T) {
	data := []byte(`harvest:
  dataSource: host=db password=${PGPASSWORD} dbname=${DB:-app}
  baseKafkaConfig:
    bootstrap.servers: ${BROKERS}
    sasl.password: ${KAFKA_PASSWORD}
    linger.ms: 5
  name: ${HOSTNAME:-fallback}
logging:
  level: ${LOG_LEVEL:-debug}
`)
	f, err := Load(data, env(map[string]string{"PGPASSWORD": "p$w{}d", "BROKERS": "k:9092", "KAFKA_PASSWORD": "${NOT_EXPANDED}"}))
	if err != nil {
		t.Fatal(err)
	}
	h := f.Harvest
	if h.DataSource != "host=db password=p$w{}d dbname=app" {
		t.Errorf("dataSource %q", h.DataSource)
	}
	if h.BaseKafkaConfig["bootstrap.servers"] != "k:9092" || h.BaseKafkaConfig["sasl.password"] != "${NOT_EXPANDED}" || h.BaseKafkaConfig["linger.ms"] != 5 {
		t.Errorf("kafka config %v", h.BaseKafkaConfig)
	}
	if h.Name != "fallback" || f.Logging.Level != "debug" {
		t.Errorf("name %q, level %q", h.Name, f.Logging.Level)
	}
}

func TestLoadErrorsNameKeyAndLine(t *testing.T) {
	cases := map[string]string{
		"harvest:\n  outboxTabel: x\n":                     `line 2: unknown key "harvest.outboxTabel"`,
		"harvest:\n  limits:\n    heartbeatTimeout: 5\n":   "line 3: harvest.limits.heartbeatTimeout:",
		"harvest:\n  limits:\n    queueTimeout: soon\n":    "line 3: harvest.limits.queueTimeout:",
		"logging:\n  levle: debug\n":                       `line 2: unknown key "logging.levle"`,
		"logging:\n  level: loud\n":                        `line 2: logging.level: "loud" is not debug, info, warn or error`,
		"logging:\n  format: xml\n":                        `line 2: logging.format: "xml" is not text or json`,
		"harvest:\n  dataSource: password=${PGPASSWORD}\n": "line 2: harvest.dataSource: environment variable PGPASSWORD is not set",
		"harvest:\n  baseKafkaConfig:\n    a.b: ${1BAD}\n": `line 3: harvest.baseKafkaConfig.a.b: "${1BAD}" is not a valid environment variable reference`,
		"harvest:\n  name: ${UNTERMINATED\n":               "line 2: harvest.name: unterminated ${",
		"harvest:\n  maxInFlightRecords: 5\n":              `line 2: unknown key "harvest.maxInFlightRecords"`,
		"harvest: [1, 2]\n":                                "line 1: harvest:",
	}
	for doc, want := range cases {
		_, err := Load([]byte(doc), env(nil))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load(%q) error = %v, want one containing %q", doc, err, want)
		}
	}
}

func TestLoggerLevelAndFormat(t *testing.T) {
	var buf bytes.Buffer
	Logging{Level: "WARN", Format: "json"}.Logger(&buf).Info("hidden")
	Logging{Level: "WARN", Format: "json"}.Logger(&buf).Warn("shown")
	if out := buf.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) {
		t.Fatalf("log output %q", out)
	}
}

// run calls Main with a file holding config, returning the exit code and what was printed.
func run(t *testing.T, config string, args ...string) (int, string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "reaper.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := Main(append(args, "-f", path), Env{Stdout: &stdout, Stderr: &stderr, LookupEnv: env(nil), Context: ctx})
	return code, stdout.String(), stderr.String()
}

func TestMainReportsOneLine(t *testing.T) {
	cases := []struct {
		name, config string
		args         []string
		code         int
		want         string
	}{
		{"unknown key", "harvest:\n  outboxTabel: x\n", nil, ExitUsage, `unknown key "harvest.outboxTabel"`},
		{"invalid config", "harvest:\n  leaderGroupID: g\n  leaderTopic: t\n  baseKafkaConfig:\n    group.id: x\n  limits:\n    sendConcurrency: -1\n", nil, ExitUsage,
			"baseKafkaConfig.group.id"},
		{"unknown command", "", []string{"reap"}, ExitUsage, `unknown command "reap"`},
		{"bad flag", "", []string{"-x"}, ExitUsage, "flag provided but not defined: -x"},
		{"bytea without init", "", []string{"-bytea"}, ExitUsage, "-bytea applies to reaper init only"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, _, stderr := run(t, c.config, c.args...)
			if code != c.code || !strings.Contains(stderr, c.want) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, stderr, c.code, c.want)
			}
			if lines := strings.Count(strings.TrimRight(stderr, "\n"), "\n"); lines != 0 || !strings.HasPrefix(stderr, "reaper: ") {
				t.Fatalf("stderr is not one line starting with \"reaper: \": %q", stderr)
			}
		})
	}
}

func TestMainMissingFile(t *testing.T) {
	var stderr bytes.Buffer
	code := Main([]string{"-f", "/nonexistent/reaper.yaml"}, Env{Stdout: &bytes.Buffer{}, Stderr: &stderr, LookupEnv: env(nil), Context: context.Background()})
	if code != ExitUsage || !strings.Contains(stderr.String(), "/nonexistent/reaper.yaml") {
		t.Fatalf("exit %d, %q", code, stderr.String())
	}
}

func TestMainVersionAndHelp(t *testing.T) {
	// Unstamped, as go build and go install make it, the reaper reports the release its source
	// is, which TestVersionIsChangelogsNewestRelease holds to CHANGELOG.md.
	for _, args := range [][]string{{"--version"}, {"version"}} {
		var stdout bytes.Buffer
		if code := Main(args, Env{Stdout: &stdout, Stderr: &stdout, Context: context.Background()}); code != ExitOK || stdout.String() != "reaper "+goharvest.Version+"\n" {
			t.Fatalf("%v: exit %d, %q, want %q", args, code, stdout.String(), "reaper "+goharvest.Version+"\n")
		}
	}
	var stdout bytes.Buffer
	if code := Main([]string{"-h"}, Env{Stdout: &stdout, Stderr: &stdout, Context: context.Background()}); code != ExitOK || !strings.Contains(stdout.String(), "reaper init") {
		t.Fatalf("help: exit %d, %q", code, stdout.String())
	}
}

// docs/configuration.md lists every key of reaper.yaml outside harvest: (whose keys
// TestDocsConfigTableMatchesConfig holds to goharvest.Config), and no key the file does not have.
func TestDocsListTheReaperSections(t *testing.T) {
	page, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	const header = "| Key | Default | Meaning |\n|---|---|---|\n"
	_, table, ok := strings.Cut(string(page), header)
	if !ok {
		t.Fatalf("docs/configuration.md has no table headed %q", strings.TrimSpace(header))
	}
	table, _, _ = strings.Cut(table, "\n\n")
	var listed []string
	for _, row := range strings.Split(table, "\n") {
		key, _, _ := strings.Cut(strings.TrimPrefix(row, "| "), " |")
		listed = append(listed, strings.Trim(key, "`"))
	}
	var want []string
	for section, v := range map[string]any{"admin": Admin{}, "logging": Logging{}} {
		typ := reflect.TypeOf(v)
		for i := range typ.NumField() {
			if tag := typ.Field(i).Tag.Get("yaml"); tag != "" && tag != "-" {
				want = append(want, section+"."+strings.Split(tag, ",")[0])
			}
		}
	}
	slices.Sort(listed)
	slices.Sort(want)
	if !slices.Equal(listed, want) {
		t.Errorf("docs/configuration.md lists the reaper's keys %v; reaper.yaml has %v", listed, want)
	}
}
