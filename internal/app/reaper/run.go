package reaper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver"
)

// harvester is one outbox's harvester in a running reaper, and the watch that keeps its
// readiness, counters and last warnings for the admin endpoints. Its metrics have a registry of
// their own, so that a reload can drop an outbox's series with it, and start it again afresh.
type harvester struct {
	outbox   Outbox
	h        *goharvest.Harvest
	store    driver.DatabaseBinding // the harvester's once started; see discard
	w        *watch
	registry *prometheus.Registry

	// Set by start.
	stop func()        // ends the harvester and its watch, and returns once both have
	done chan struct{} // closed once the harvester has stopped, err set
	err  error         // why it stopped: nil after a clean stop
}

// serve runs a harvester for each outbox until env.Context ends, with the admin endpoints, and
// returns the exit code. On each signal of env.Reload it reads the file again and applies it
// (see fleet.reload).
//
// The outboxes are independent: each has its own pool, election and producers, so one whose
// database is down publishes nothing while the others go on. One whose harvester stops with an
// error (a Kafka ACL refusal, say, which only shows at run time) stays stopped, and /readyz and
// the status page name it, while the others go on publishing, until a reload starts it again;
// the reaper exits 1 once every outbox has stopped, or at SIGTERM if any stopped with an error.
// A file with one outbox therefore exits when its harvester stops, as it always did.
func serve(env Env, cfg File, outboxes []Outbox, file, only string) int {
	fail := func(code int, err error) int {
		fmt.Fprintln(env.Stderr, "reaper: "+strings.ReplaceAll(err.Error(), "\n", "; "))
		return code
	}
	f := &fleet{env: env, cfg: cfg, file: file, only: only, logger: cfg.Logging.Logger(env.Stderr),
		process: prometheus.NewRegistry(), exits: make(chan *harvester), quit: make(chan struct{})}
	f.process.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	defer close(f.quit)
	var harvesters []*harvester
	for _, o := range outboxes {
		r, err := f.newHarvester(o, cfg)
		if err != nil {
			discard(harvesters)
			if !cfg.listed {
				return fail(ExitUsage, fmt.Errorf("%s: %w", file, err))
			}
			// Every outbox is checked before any starts: a mistake in one stops the reaper at
			// once, rather than leave an outbox unpublished from the start.
			return fail(ExitUsage, fmt.Errorf("%s: %s: %w", file, o.where(), err))
		}
		harvesters = append(harvesters, r)
	}
	f.current = harvesters // before the endpoints can ask for them
	if cfg.listed {
		f.logger.Info("reaper starting", "version", Version(), "config", file, "outboxes", len(harvesters))
	} else {
		r := harvesters[0]
		r.w.cfg.Logger.Info("reaper starting", "version", Version(), "config", file, "kafkaClient", r.w.cfg.KafkaClient)
	}
	if cfg.Admin.Address != "" {
		ln, err := net.Listen("tcp", cfg.Admin.Address)
		if err != nil {
			discard(harvesters)
			return fail(ExitFailed, fmt.Errorf("admin endpoints: %w", err))
		}
		srv := &http.Server{Handler: adminHandler(f.list, cfg.listed, f.gatherer()), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		f.logger.Info("serving the status page at /, and /metrics, /healthz, /readyz, /held and /shards", "address", ln.Addr().String())
	}
	for _, r := range harvesters {
		f.start(r)
	}

	ending := env.Context.Done()
	for !f.allStopped() {
		select {
		case <-ending:
			// Every harvester's context ends with this one: wait for them all to stop.
			ending = nil
		case <-env.Reload:
			if env.Context.Err() == nil {
				f.reload()
			}
		case r := <-f.exits:
			if r.err != nil && f.isCurrent(r) && env.Context.Err() == nil && cfg.listed {
				r.w.cfg.Logger.Error("outbox stopped on an error; the other outboxes go on, and /readyz names this one until a reload (SIGHUP) or a restart starts it again", "error", r.err)
			}
		}
	}
	var failed []error
	for _, r := range f.list() {
		r.stop()
		switch {
		case r.err == nil:
		case cfg.listed:
			failed = append(failed, fmt.Errorf("outbox %q stopped: %w", r.outbox.Name, r.err))
		default:
			failed = append(failed, r.err)
		}
	}
	if len(failed) > 0 {
		return fail(ExitFailed, errors.Join(failed...))
	}
	return ExitOK
}

// newHarvester makes the harvester of one outbox of file cfg and its watch, with a registry
// for their metrics: in a file that lists outboxes, labelled outbox with its name.
func (f *fleet) newHarvester(o Outbox, cfg File) (*harvester, error) {
	h := o.Harvest
	if h.Name == "" {
		h.Name = cfg.defaultName
	}
	// The status page shows each outbox's last warnings and errors, so they pass through its own
	// log on their way.
	logs := &recentLog{}
	base := cfg.Logging.Logger(f.env.Stderr)
	registry := prometheus.NewRegistry()
	var registerer prometheus.Registerer = registry
	if cfg.listed {
		base = base.With("outbox", o.Name)
		registerer = prometheus.WrapRegistererWith(prometheus.Labels{"outbox": o.Name}, registry)
	}
	h.Logger = slog.New(&capture{next: base.Handler(), log: logs, hideKeys: cfg.Admin.HideKeys})
	h.MetricsRegisterer = registerer
	// The settings as the harvester will apply them (New logs what it defaults, so not here).
	quiet := h
	quiet.Logger = slog.New(slog.DiscardHandler)
	settings := quiet.WithDefaults()
	settings.Logger = h.Logger
	hc, err := h.HarvestConfig()
	if err != nil {
		return nil, err
	}
	harvest, err := goharvest.New(hc)
	if err != nil {
		hc.Store.Dispose()
		return nil, err
	}
	w := newWatch(harvest, settings, registry, cfg.Admin.HideKeys, logs)
	if cfg.listed {
		w.outbox = o.Name
	}
	info, ready := w.collectors()
	// goharvest_reaper_info names the outbox in a label of its own (as it always has, where its
	// name is its table's), so it goes to the registry as it is.
	registry.MustRegister(info)
	registerer.MustRegister(ready)
	return &harvester{outbox: o, h: harvest, store: hc.Store, w: w, registry: registry}, nil
}

// discard releases harvesters that were made and will never start: their stores, which a
// harvester disposes of itself only once started.
func discard(harvesters []*harvester) {
	for _, r := range harvesters {
		r.store.Dispose()
	}
}

// The admin endpoints, for probes, scrapers and operators (examples/kubernetes checks its
// manifest against them). ReadyzTimeout bounds how long /readyz waits for the database and Kafka to
// answer, so a probe's own timeout must be longer. OutboxParam names one outbox in a query
// (/readyz?outbox=billing).
const (
	StatusPath    = "/"
	MetricsPath   = "/metrics"
	HealthzPath   = "/healthz"
	ReadyzPath    = "/readyz"
	HeldPath      = "/held"
	ShardsPath    = "/shards"
	ReadyzTimeout = 3 * time.Second
	OutboxParam   = "outbox"
)

// adminHandler serves the status page (StatusPath), the metrics, the health probes, the held
// records (HeldPath, JSON) and the shards this reaper publishes (ShardsPath, JSON). A probe
// answers 200 with "ok", or 503 with what is wrong.
//
// With several outboxes (listed), the probes judge them all, each line of an answer naming its
// outbox, or the one ?outbox=NAME names; /held and /shards need ?outbox=NAME, as they describe
// one outbox; the status page lists the outboxes, and shows one in full with ?outbox=NAME.
func adminHandler(list func() []*harvester, listed bool, metrics prometheus.Gatherer) http.Handler {
	mux := http.NewServeMux()
	// chosen returns the harvesters a request asks about: the one ?outbox= names, or all.
	chosen := func(r *http.Request) ([]*harvester, error) {
		harvesters := list()
		name := r.URL.Query().Get(OutboxParam)
		if name == "" {
			return harvesters, nil
		}
		for _, h := range harvesters {
			if h.outbox.Name == name {
				return []*harvester{h}, nil
			}
		}
		return nil, fmt.Errorf("no outbox %q here; there are %s", name, namesOf(harvesters))
	}
	// one returns the harvester a request about one outbox asks about.
	one := func(rw http.ResponseWriter, r *http.Request) *harvester {
		hs, err := chosen(r)
		if err == nil && len(hs) > 1 {
			err = fmt.Errorf("name an outbox with ?%s=NAME; there are %s", OutboxParam, namesOf(hs))
		}
		if err != nil {
			http.Error(rw, err.Error(), http.StatusNotFound)
			return nil
		}
		return hs[0]
	}
	// probe answers 200 "ok" when check passes for every chosen outbox, else 503 with a line
	// for each that fails (naming it, when the reaper has several).
	probe := func(check func(context.Context, *harvester) error) http.HandlerFunc {
		return func(rw http.ResponseWriter, r *http.Request) {
			hs, err := chosen(r)
			if err != nil {
				http.Error(rw, err.Error(), http.StatusNotFound)
				return
			}
			ctx, cancel := context.WithTimeout(r.Context(), ReadyzTimeout)
			defer cancel()
			errs := make([]error, len(hs))
			var wg sync.WaitGroup
			for i, h := range hs {
				wg.Go(func() { errs[i] = check(ctx, h) })
			}
			wg.Wait()
			var lines []string
			for i, err := range errs {
				if err == nil {
					continue
				}
				if listed {
					lines = append(lines, fmt.Sprintf("outbox %s: %v", hs[i].outbox.Name, err))
				} else {
					lines = append(lines, err.Error())
				}
			}
			if len(lines) > 0 {
				http.Error(rw, strings.Join(lines, "\n"), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(rw, "ok")
		}
	}
	mux.HandleFunc("GET "+StatusPath+"{$}", func(rw http.ResponseWriter, r *http.Request) {
		if !listed {
			list()[0].w.serveStatus(rw, r)
			return
		}
		if r.URL.Query().Get(OutboxParam) == "" {
			serveOverview(rw, list())
			return
		}
		if h := one(rw, r); h != nil {
			h.w.serveStatus(rw, r)
		}
	})
	mux.Handle(MetricsPath, promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
	// Liveness: a restart cures a stuck loop, so a running outbox's counts. An outbox stopped on
	// an error is readiness's to report: restarting the process for it would interrupt the
	// others, every time, for what is usually a setting to fix.
	mux.Handle(HealthzPath, probe(func(_ context.Context, h *harvester) error {
		if err := h.w.stopErr(); err != nil && listed {
			return nil
		}
		return h.h.Healthy()
	}))
	mux.Handle(ReadyzPath, probe(func(ctx context.Context, h *harvester) error {
		if err := h.w.stopErr(); err != nil {
			return fmt.Errorf("stopped: %w", err)
		}
		return h.h.Ready(ctx)
	}))
	mux.HandleFunc(HeldPath, func(rw http.ResponseWriter, r *http.Request) {
		h := one(rw, r)
		if h == nil {
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		report := heldReport{Leader: h.h.IsLeader(), Records: h.h.HeldRecords(), KeysHidden: h.w.hideKeys}
		if report.KeysHidden {
			for i := range report.Records {
				report.Records[i].Key = ""
			}
		}
		json.NewEncoder(rw).Encode(report)
	})
	mux.HandleFunc(ShardsPath, func(rw http.ResponseWriter, r *http.Request) {
		h := one(rw, r)
		if h == nil {
			return
		}
		report := shardsReport{Shards: h.h.ShardCount(), Leads: []ledShard{}}
		led := h.h.LeadShards()
		for _, shard := range slices.Sorted(maps.Keys(led)) {
			report.Leads = append(report.Leads, ledShard{Shard: shard, LeaderID: led[shard].String()})
		}
		rw.Header().Set("Content-Type", "application/json")
		json.NewEncoder(rw).Encode(report)
	})
	return mux
}

// namesOf lists the outboxes' names for answers.
func namesOf(harvesters []*harvester) string {
	names := make([]string, len(harvesters))
	for i, h := range harvesters {
		names[i] = h.outbox.Name
	}
	return strings.Join(names, ", ")
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
