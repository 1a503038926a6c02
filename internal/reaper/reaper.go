// Package reaper is the reaper sidecar: it runs a harvester configured by a YAML file, for
// services written in any language. cmd/reaper is a thin main around Main.
package reaper

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/strictyaml"
	"github.com/goharvest/goharvest/outbox"
)

// Exit codes.
const (
	ExitOK     = 0 // a clean stop (SIGINT or SIGTERM), or a command that succeeded
	ExitFailed = 1 // the harvester stopped on an error, or init failed
	ExitUsage  = 2 // bad arguments, or a configuration that cannot be loaded
)

// File is the reaper's configuration file.
type File struct {
	// Harvest configures the harvester; the keys are those of goharvest.Config.
	Harvest goharvest.Config `yaml:"harvest"`
	Logging Logging          `yaml:"logging"`
	Admin   Admin            `yaml:"admin"`
}

// Admin configures the reaper's HTTP endpoints: /metrics (Prometheus), /healthz (liveness:
// the process and its loop are alive) and /readyz (readiness: Postgres and Kafka answer, so the
// reaper leads or can take over at once).
type Admin struct {
	// Address to listen on, such as ":9090" or "127.0.0.1:9090". Empty (the default): no
	// endpoints.
	Address string `yaml:"address"`
	// HideKeys leaves the Kafka keys of held records out of the status page, /held and the
	// status page's log lines, for keys that carry personal data. Default: false.
	HideKeys bool `yaml:"hideKeys"`
}

// Logging configures the reaper's logs, written to standard error.
type Logging struct {
	// Level is debug, info (the default), warn or error; case does not matter.
	Level string `yaml:"level"`
	// Format is text (the default) or json.
	Format string `yaml:"format"`
}

// Load reads a configuration file strictly: unknown keys and values of the wrong type are errors
// naming the key and its line. In string values (the data source, Kafka properties, names),
// ${NAME} is replaced by the environment variable NAME, and ${NAME:-default} by default when
// NAME is unset or empty, so secrets need not live in the file. An unset variable without a
// default is an error naming it.
func Load(data []byte, lookupEnv func(string) (string, bool)) (File, error) {
	var f File
	if err := strictyaml.Unmarshal(data, &f); err != nil {
		return File{}, err
	}
	lines := strictyaml.Lines(data)
	var errs []error
	expand := func(path string, value *string) {
		expanded, err := expandEnv(*value, lookupEnv)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %s: %w", lines[path], path, err))
			return
		}
		*value = expanded
	}
	h := &f.Harvest
	expand("harvest.dataSource", &h.DataSource)
	expand("harvest.outboxTable", &h.OutboxTable)
	expand("harvest.leaderTopic", &h.LeaderTopic)
	expand("harvest.leaderGroupID", &h.LeaderGroupID)
	expand("harvest.name", &h.Name)
	for _, m := range []struct {
		path  string
		props goharvest.KafkaConfigMap
	}{{"harvest.baseKafkaConfig", h.BaseKafkaConfig}, {"harvest.producerKafkaConfig", h.ProducerKafkaConfig}} {
		for _, key := range slices.Sorted(maps.Keys(m.props)) {
			if s, ok := m.props[key].(string); ok {
				expand(m.path+"."+key, &s)
				m.props[key] = s
			}
		}
	}
	expand("admin.address", &f.Admin.Address)
	expand("logging.level", &f.Logging.Level)
	expand("logging.format", &f.Logging.Format)
	if _, err := f.Logging.level(); err != nil {
		errs = append(errs, fmt.Errorf("line %d: logging.level: %w", lines["logging.level"], err))
	}
	if f := strings.ToLower(f.Logging.Format); f != "" && f != "text" && f != "json" {
		errs = append(errs, fmt.Errorf("line %d: logging.format: %q is not text or json", lines["logging.format"], f))
	}
	return f, errors.Join(errs...)
}

var (
	envRef  = regexp.MustCompile(`\$\{[^}]*\}`)
	envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// expandEnv replaces ${NAME} and ${NAME:-default} in s. A variable's value is not expanded
// again.
func expandEnv(s string, lookupEnv func(string) (string, bool)) (string, error) {
	var err error
	out := envRef.ReplaceAllStringFunc(s, func(ref string) string {
		name, def, hasDefault := strings.Cut(ref[2:len(ref)-1], ":-")
		if !envName.MatchString(name) {
			err = fmt.Errorf("%q is not a valid environment variable reference", ref)
			return ref
		}
		if value, ok := lookupEnv(name); ok && (value != "" || !hasDefault) {
			return value
		} else if hasDefault {
			return def
		}
		err = fmt.Errorf("environment variable %s is not set", name)
		return ref
	})
	if err != nil {
		return s, err
	}
	if strings.Contains(envRef.ReplaceAllString(s, ""), "${") {
		return s, errors.New("unterminated ${")
	}
	return out, nil
}

func (l Logging) level() (slog.Level, error) {
	switch strings.ToLower(l.Level) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug", "trace":
		return slog.LevelDebug, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("%q is not debug, info, warn or error", l.Level)
}

// Logger returns the logger the configuration asks for, writing to w.
func (l Logging) Logger(w io.Writer) *slog.Logger {
	level, _ := l.level()
	opts := &slog.HandlerOptions{Level: level}
	if strings.EqualFold(l.Format, "json") {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// version is stamped at link time by builds that name their own: make image passes
// -ldflags "-X github.com/goharvest/goharvest/internal/reaper.version=...".
var version string

// Version is the reaper's version: the one stamped at link time, else goharvest.Version, the
// release this source is (CHANGELOG.md's newest). The module version Go records in a build is
// not used: for a build in a clone it is a pseudo-version that no changelog names.
func Version() string {
	if version != "" {
		return version
	}
	return goharvest.Version
}

const usage = `usage:
  reaper [-f reaper.yaml]                 publish the outbox until SIGINT or SIGTERM
  reaper init [-f reaper.yaml]            create the outbox and dead-letter tables if they do not exist
                                          (and, with harvest.shards > 1, the shard index)
  reaper init -bytea [-f reaper.yaml]     ... with bytea kafka_key, kafka_value, kafka_header_values
  reaper held [-f reaper.yaml]            list the records the running reaper holds back (from admin.address)
  reaper dead-letter ID [-f reaper.yaml]  move outbox record ID into the dead-letter table now
  reaper requeue ID [-f reaper.yaml]      move dead letter ID back into the outbox, as a new record at the tail
  reaper rules [-f reaper.yaml] [-sustained 2m]
                                          print Prometheus alerting rules with thresholds derived from the configuration
  reaper --version                        print the version
`

// Env is what Main takes from its surroundings, so that tests can supply their own.
type Env struct {
	Stdout, Stderr io.Writer
	LookupEnv      func(string) (string, bool)
	// Context ends the harvester (as SIGINT or SIGTERM would).
	Context context.Context
}

// Main runs the reaper with the given arguments (without the program name) and returns the exit
// code. Every failure is one line on standard error.
func Main(args []string, env Env) int {
	fail := func(code int, err error) int {
		fmt.Fprintln(env.Stderr, "reaper: "+strings.ReplaceAll(err.Error(), "\n", "; "))
		return code
	}
	command := "run"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		command, args = args[0], args[1:]
	}
	var idArg string // the record of dead-letter and requeue, before or after the flags
	if (command == "dead-letter" || command == "requeue") && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		idArg, args = args[0], args[1:]
	}
	var err error
	flags := flag.NewFlagSet("reaper", flag.ContinueOnError)
	flags.SetOutput(io.Discard)
	file := flags.String("f", "reaper.yaml", "configuration file")
	version := flags.Bool("version", false, "print the version")
	bytea := flags.Bool("bytea", false, "init: create bytea payload columns")
	sustained := flags.Duration("sustained", DefaultSustained, "rules: how long errors or failing readiness last before an alert")
	if err = flags.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(env.Stdout, usage)
			return ExitOK
		}
		return fail(ExitUsage, fmt.Errorf("%w (see reaper -h)", err))
	}
	if *version || command == "version" {
		fmt.Fprintln(env.Stdout, "reaper", Version())
		return ExitOK
	}
	if idArg == "" && (command == "dead-letter" || command == "requeue") && flags.NArg() > 0 {
		idArg = flags.Arg(0)
		flags.Parse(flags.Args()[1:])
	}
	if flags.NArg() > 0 {
		return fail(ExitUsage, fmt.Errorf("unexpected argument %q (see reaper -h)", flags.Arg(0)))
	}
	if *bytea && command != "init" {
		return fail(ExitUsage, errors.New("-bytea applies to reaper init only (see reaper -h)"))
	}
	var id int64
	switch command {
	case "run", "init", "held", "rules":
	case "dead-letter", "requeue":
		if id, err = strconv.ParseInt(idArg, 10, 64); err != nil || id <= 0 {
			return fail(ExitUsage, fmt.Errorf("%s needs a record id, got %q (see reaper -h)", command, idArg))
		}
	default:
		return fail(ExitUsage, fmt.Errorf("unknown command %q (see reaper -h)", command))
	}

	data, err := os.ReadFile(*file)
	if err != nil {
		return fail(ExitUsage, err)
	}
	cfg, err := Load(data, env.LookupEnv)
	if err != nil {
		return fail(ExitUsage, fmt.Errorf("%s: %w", *file, err))
	}
	// The status page shows the last warnings and errors, so they pass through logs on their way.
	logs := &recentLog{}
	cfg.Harvest.Logger = slog.New(&capture{next: cfg.Logging.Logger(env.Stderr).Handler(), log: logs, hideKeys: cfg.Admin.HideKeys})
	// The settings as the harvester will apply them (New logs what it defaults, so not here),
	// with its name fixed now, so that the reaper's own metrics carry the same harvest label.
	quiet := cfg.Harvest
	quiet.Logger = slog.New(slog.DiscardHandler)
	settings := quiet.WithDefaults()
	settings.Logger = cfg.Harvest.Logger
	cfg.Harvest.Name = settings.Name

	switch command {
	case "rules":
		if *sustained <= 0 {
			return fail(ExitUsage, errors.New("-sustained must be positive (see reaper -h)"))
		}
		env.Stdout.Write(RulesFile(settings, *sustained))
		return ExitOK
	case "init":
		h := cfg.Harvest.WithDefaults()
		// With shards, the index each shard's mark walks comes with the table.
		opts := outbox.TableOptions{Bytea: *bytea, Shards: h.Shards}
		if err := goharvest.CreateOutboxTableWith(env.Context, h.DataSource, h.OutboxTable, opts); err != nil {
			return fail(ExitFailed, err)
		}
		fmt.Fprintf(env.Stdout, "outbox table %s is ready, with its dead-letter table %s\n", h.OutboxTable, outbox.DeadLetterTable(h.OutboxTable))
		if h.Shards > 1 {
			fmt.Fprintf(env.Stdout, "and the index for %d shards\n", h.Shards)
		}
		return ExitOK
	case "held", "dead-letter", "requeue":
		if err := operate(env, command, id, cfg); err != nil {
			return fail(ExitFailed, err)
		}
		return ExitOK
	}

	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Harvest.MetricsRegisterer = registry
	h, err := goharvest.New(cfg.Harvest)
	if err != nil {
		return fail(ExitUsage, fmt.Errorf("%s: %w", *file, err))
	}
	w := newWatch(h, settings, registry, cfg.Admin.HideKeys, logs)
	registry.MustRegister(w.collectors()...)
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watchDone := make(chan struct{})
	go func() { defer close(watchDone); w.run(watchCtx) }()
	defer func() { stopWatch(); <-watchDone }()
	cfg.Harvest.Logger.Info("reaper starting", "version", Version(), "config", *file, "kafkaClient", settings.KafkaClient)
	if cfg.Admin.Address != "" {
		ln, err := net.Listen("tcp", cfg.Admin.Address)
		if err != nil {
			return fail(ExitFailed, fmt.Errorf("admin endpoints: %w", err))
		}
		srv := &http.Server{Handler: adminHandler(h, registry, w), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		cfg.Harvest.Logger.Info("serving the status page at /, and /metrics, /healthz, /readyz, /held and /shards", "address", ln.Addr().String())
	}
	if err := h.Run(env.Context); err != nil {
		return fail(ExitFailed, err)
	}
	return ExitOK
}

// The admin endpoints, for probes, scrapers and operators (examples/kubernetes checks its
// manifest against them). ReadyzTimeout bounds how long /readyz waits for Postgres and Kafka to
// answer, so a probe's own timeout must be longer.
const (
	StatusPath    = "/"
	MetricsPath   = "/metrics"
	HealthzPath   = "/healthz"
	ReadyzPath    = "/readyz"
	HeldPath      = "/held"
	ShardsPath    = "/shards"
	ReadyzTimeout = 3 * time.Second
)

// adminHandler serves the status page (StatusPath), the metrics, the health probes, the held
// records (HeldPath, JSON) and the shards this reaper publishes (ShardsPath, JSON). A probe
// answers 200 with "ok", or 503 with what is wrong.
func adminHandler(h *goharvest.Harvest, registry *prometheus.Registry, w *watch) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+StatusPath+"{$}", w.serveStatus)
	mux.Handle(MetricsPath, promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	probe := func(check func(*http.Request) error) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if err := check(r); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		}
	}
	mux.Handle(HealthzPath, probe(func(*http.Request) error { return h.Healthy() }))
	mux.HandleFunc(HeldPath, func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		report := heldReport{Leader: h.IsLeader(), Records: h.HeldRecords(), KeysHidden: w.hideKeys}
		if report.KeysHidden {
			for i := range report.Records {
				report.Records[i].Key = ""
			}
		}
		json.NewEncoder(rw).Encode(report)
	})
	mux.HandleFunc(ShardsPath, func(rw http.ResponseWriter, r *http.Request) {
		report := shardsReport{Shards: h.ShardCount(), Leads: []ledShard{}}
		led := h.LeadShards()
		for _, shard := range slices.Sorted(maps.Keys(led)) {
			report.Leads = append(report.Leads, ledShard{Shard: shard, LeaderID: led[shard].String()})
		}
		rw.Header().Set("Content-Type", "application/json")
		json.NewEncoder(rw).Encode(report)
	})
	mux.Handle(ReadyzPath, probe(func(r *http.Request) error {
		ctx, cancel := context.WithTimeout(r.Context(), ReadyzTimeout)
		defer cancel()
		return h.Ready(ctx)
	}))
	return mux
}

// shardsReport is what /shards serves: how many shards the outbox has, and which of them this
// reaper publishes now, each under its current leader ID.
type shardsReport struct {
	Shards int        `json:"shards"`
	Leads  []ledShard `json:"leads"`
}

type ledShard struct {
	Shard    int    `json:"shard"`
	LeaderID string `json:"leaderID"`
}

// SignalContext returns a context that ends on SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
