// Package reaper is the reaper sidecar: it runs a harvester configured by a YAML file, for
// services written in any language. cmd/reaper is a thin main around Main.
package reaper

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"go.yaml.in/yaml/v3"

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
	// Harvest configures the harvester and its drivers (see Settings). In a file that
	// lists outboxes, it holds what they share, and each entry is merged over it.
	Harvest Settings `yaml:"harvest"`
	// Outboxes are the outboxes the reaper publishes, each with a harvester of its own. Load
	// fills it: from outboxes:, or with the one outbox of harvest: when the file lists none.
	Outboxes []Outbox `yaml:"outboxes"`
	Logging  Logging  `yaml:"logging"`
	Admin    Admin    `yaml:"admin"`

	// listed: the file has outboxes:, so every outbox's metrics and logs carry its name
	// (a harvest:-only file's series stay as they were).
	listed bool
	// defaultName names the reaper's harvesters where harvest.name does not: the default of
	// goharvest.Config.Name, made once per process so that a reload names them as before.
	defaultName string
}

// Admin configures the reaper's HTTP endpoints: /metrics (Prometheus), /healthz (liveness:
// the process and its loop are alive) and /readyz (readiness: the database and Kafka answer, so the
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
// naming the key and its line. It fills Outboxes (see Outbox), refusing, with the lines of both,
// two outboxes that share a name, an election group, a leader topic, a table or a harvester's
// name. In string values (the data source, Kafka properties, names),
// ${NAME} is replaced by the environment variable NAME, and ${NAME:-default} by default when
// NAME is unset or empty, so secrets need not live in the file. An unset variable without a
// default is an error naming it.
func Load(data []byte, lookupEnv func(string) (string, bool)) (File, error) {
	return load(data, lookupEnv, "")
}

// load is Load, naming the harvesters that harvest.name leaves unnamed after defaultName, or
// after goharvest.Config.Name's default when it is "".
func load(data []byte, lookupEnv func(string) (string, bool), defaultName string) (File, error) {
	if defaultName == "" {
		defaultName = goharvest.Config{Logger: slog.New(slog.DiscardHandler)}.WithDefaults().Name
	}
	var f File
	// The strict pass reports unknown keys and values of the wrong type, with their lines; the
	// values are then read from the document, after expansion and merging.
	if err := strictyaml.Unmarshal(data, &f); err != nil {
		return File{}, err
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return File{}, err
	}
	doc := &root
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		doc = root.Content[0]
	}
	var errs []error
	expand := func(path string, value *yaml.Node) {
		expanded, err := expandEnv(value.Value, lookupEnv)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %s: %w", value.Line, path, err))
			return
		}
		value.Value = expanded
	}
	shared := lookup(doc, "harvest")
	expandHarvest(shared, "harvest", expand)
	entries := lookup(doc, "outboxes")
	if entries != nil {
		for _, entry := range entries.Content {
			path := "outboxes[" + strconv.Itoa(entry.Line) + "]"
			if name := lookup(entry, "outbox"); name != nil {
				path = "outboxes[" + name.Value + "]"
			}
			expandHarvest(entry, path, expand)
		}
	}
	for _, section := range []string{"admin.address", "logging.level", "logging.format"} {
		name, key, _ := strings.Cut(section, ".")
		if value := lookup(lookup(doc, name), key); value != nil && value.Kind == yaml.ScalarNode {
			expand(section, value)
		}
	}
	f = File{defaultName: defaultName}
	if doc.Kind == yaml.MappingNode {
		if err := doc.Decode(&f); err != nil {
			return File{}, err
		}
	}
	if entries == nil {
		// One outbox, as before outboxes: existed, named after its table.
		table := f.Harvest.OutboxTable
		if table == "" {
			table = outbox.DefaultTable
		}
		f.Outboxes = []Outbox{{Name: table, Harvest: f.Harvest}}
	} else {
		var problems []error
		f.Outboxes, problems = resolveOutboxes(shared, entries, defaultName)
		errs = append(errs, problems...)
		f.listed = true
	}
	lines := strictyaml.Lines(data)
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
// -ldflags "-X github.com/goharvest/goharvest/internal/app/reaper.version=...".
var version string

// Version is the reaper's version: the one stamped at link time, else goharvest.Version: the
// release this source is (CHANGELOG.md's newest) or, between releases, the development version
// of the next (v0.5.0-dev). A development build names its commit too, as semver build metadata,
// when Go recorded it (go build in a git checkout; runtime/debug's vcs.revision and vcs.modified):
// v0.5.0-dev+0123456789ab, with .dirty if the checkout had changes. The module version Go records
// is not used: for a build in a clone it is a pseudo-version that no changelog names.
func Version() string {
	if version != "" {
		return version
	}
	v := goharvest.Version
	info, ok := debug.ReadBuildInfo()
	if !ok || !strings.HasSuffix(v, "-dev") {
		return v
	}
	var revision string
	var modified bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if revision == "" {
		return v
	}
	v += "+" + revision[:min(12, len(revision))]
	if modified {
		v += ".dirty"
	}
	return v
}

const usage = `usage:
  reaper [-f reaper.yaml] [-outbox NAME]  publish the outboxes (or the one named) until SIGINT or SIGTERM
  reaper init [-f reaper.yaml]            create each outbox's table and dead-letter table if they do not exist
                                          (and, with shards > 1 in Postgres, the shard index); -outbox NAME: that one only
  reaper init -bytea [-f reaper.yaml]     ... with bytea kafka_key, kafka_value, kafka_header_values (Postgres)
  reaper held [-f reaper.yaml]            list the records the running reaper holds back (from admin.address)
  reaper dead-letter ID [-f reaper.yaml]  move outbox record ID into the dead-letter table now
  reaper requeue ID [-f reaper.yaml]      move dead letter ID back into the outbox, as a new record at the tail
  reaper reload [-f reaper.yaml] [-pid 1] check the file, then have the running reaper (process -pid,
                                          1 in its image) apply it: a SIGHUP
  reaper rules [-f reaper.yaml] [-sustained 2m]
                                          print Prometheus alerting rules with thresholds derived from the configuration
  reaper --version                        print the version

  held, dead-letter, requeue and rules concern one outbox: with a file that lists several
  (outboxes:), name it with -outbox NAME.
`

// Env is what Main takes from its surroundings, so that tests can supply their own.
type Env struct {
	Stdout, Stderr io.Writer
	LookupEnv      func(string) (string, bool)
	// Context ends the harvester (as SIGINT or SIGTERM would).
	Context context.Context
	// Reload asks a running reaper to read its file again and apply it: ReloadSignal's SIGHUPs,
	// or nil.
	Reload <-chan os.Signal
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
	outboxName := flags.String("outbox", "", "the outbox a command concerns, when the file lists several")
	sustained := flags.Duration("sustained", DefaultSustained, "rules: how long errors or failing readiness last before an alert")
	pid := flags.Int("pid", 1, "reload: the running reaper's process")
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
	case "run", "init", "held", "rules", "reload":
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

	switch command {
	case "reload":
		// The file loaded, so the reaper will not refuse it for what Load checks; what only a
		// harvester's validation finds, its log says.
		if err := signalReload(*pid); err != nil {
			return fail(ExitFailed, err)
		}
		fmt.Fprintf(env.Stdout, "%s loads; sent SIGHUP to process %d, whose log says what it applied\n", *file, *pid)
		return ExitOK
	case "rules":
		if *sustained <= 0 {
			return fail(ExitUsage, errors.New("-sustained must be positive (see reaper -h)"))
		}
		o, err := cfg.pick(*outboxName)
		if err != nil {
			return fail(ExitUsage, err)
		}
		// Defaults are applied quietly: New logs what it defaults, and no harvester runs here.
		h := o.Harvest
		h.Logger = slog.New(slog.DiscardHandler)
		env.Stdout.Write(RulesFile(h.WithDefaults().Config, *sustained))
		return ExitOK
	case "init":
		outboxes, err := cfg.selected(*outboxName)
		if err != nil {
			return fail(ExitUsage, err)
		}
		if err := initOutboxes(env, outboxes, *bytea, cfg.listed); err != nil {
			return fail(ExitFailed, err)
		}
		return ExitOK
	case "held", "dead-letter", "requeue":
		o, err := cfg.pick(*outboxName)
		if err != nil {
			return fail(ExitUsage, err)
		}
		if err := operate(env, command, id, cfg, o); err != nil {
			return fail(ExitFailed, err)
		}
		return ExitOK
	}
	outboxes, err := cfg.selected(*outboxName)
	if err != nil {
		return fail(ExitUsage, err)
	}
	return serve(env, cfg, outboxes, *file, *outboxName)
}

// initOutboxes creates each outbox's table, with its dead-letter table and, with shards in
// Postgres, the index each shard's mark walks, where they are missing. It goes on past an outbox it cannot
// create, so that one run reports every failure.
func initOutboxes(env Env, outboxes []Outbox, bytea, listed bool) error {
	var errs []error
	for _, o := range outboxes {
		h := o.Harvest
		h.Logger = slog.New(slog.DiscardHandler)
		h = h.WithDefaults()
		prefix := ""
		if listed {
			prefix = fmt.Sprintf("outbox %s: ", o.Name)
		}
		extra, err := h.createTable(env.Context, bytea)
		if err != nil {
			if listed {
				err = fmt.Errorf("%s: %w", o.where(), err)
			}
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(env.Stdout, "%soutbox table %s is ready, with its dead-letter table %s\n", prefix, h.OutboxTable, outbox.DeadLetterTable(h.OutboxTable))
		if extra != "" {
			fmt.Fprintf(env.Stdout, "%s%s\n", prefix, extra)
		}
	}
	return errors.Join(errs...)
}

// SignalContext returns a context that ends on SIGINT or SIGTERM.
func SignalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// signalReload sends SIGHUP to process pid.
func signalReload(pid int) error {
	p, err := os.FindProcess(pid)
	if err == nil {
		err = p.Signal(syscall.SIGHUP)
	}
	if err != nil {
		return fmt.Errorf("reload: signal process %d: %w", pid, err)
	}
	return nil
}

// ReloadSignal returns a channel that receives each SIGHUP, for Env.Reload (a SIGHUP would
// otherwise end the process), and a function that stops it. Its buffer of one makes the
// SIGHUPs that come while a reload runs one more reload, not many.
func ReloadSignal() (<-chan os.Signal, func()) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	return hup, func() { signal.Stop(hup) }
}
