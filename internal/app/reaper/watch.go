package reaper

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/wakegrid"
)

// watch keeps what the status page and goharvest_reaper_ready need between requests: the last
// readiness answer, a few minutes of the record counters (for the throughput chart) and the
// last warnings and errors logged. Everything it knows comes from the harvester's public
// methods, its metrics and its log.
type watch struct {
	h        *goharvest.Harvest
	cfg      Settings             // defaults applied
	registry *prometheus.Registry // the harvester's metrics (not the other outboxes')
	hideKeys bool
	logs     *recentLog
	started  time.Time
	every    time.Duration
	// outbox is the outbox's name in a reaper whose file lists outboxes; "" otherwise.
	outbox string

	mu      sync.Mutex
	ready   error
	checked time.Time // zero until the first check
	samples []counterSample
	// stop is why the harvester stopped on an error; set once, by the goroutine that ran it.
	stop error
}

// counterSample is one reading of the record counters of the watched harvester.
type counterSample struct {
	at                        time.Time
	marked, published, purged float64
}

// chartSpan is how far back the throughput chart reaches.
const chartSpan = 10 * time.Minute

func newWatch(h *goharvest.Harvest, cfg Settings, registry *prometheus.Registry, hideKeys bool, logs *recentLog) *watch {
	// Often enough for the chart and for an alert on readiness, and never more often than the
	// election's own heartbeat timeout would notice a change.
	every := min(max(cfg.Limits.HeartbeatTimeout, time.Second), 5*time.Second)
	return &watch{h: h, cfg: cfg, registry: registry, hideKeys: hideKeys, logs: logs, started: time.Now(), every: every}
}

// collectors are the reaper's own metrics of one outbox: what its harvester is
// (goharvest_reaper_info, which the alerting rules join on to group the reapers of one outbox)
// and whether it is ready. info's label outbox is the outbox's name: its table's in a file
// without outboxes:, as it was before they existed.
func (w *watch) collectors() (info, ready prometheus.Collector) {
	outbox := w.outbox
	if outbox == "" {
		outbox = w.cfg.OutboxTable
	}
	gauge := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "goharvest_reaper_info",
		Help: "1, labelled with the reaper's version and leader group (leaderGroupID), which the reapers of one outbox share.",
		ConstLabels: prometheus.Labels{"harvest": w.cfg.Name, "group": w.cfg.LeaderGroupID,
			"outbox": outbox, "version": Version()},
	})
	gauge.Set(1)
	ready = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "goharvest_reaper_ready",
		Help:        "1 while the reaper's last readiness check (what /readyz answers) passed, else 0.",
		ConstLabels: prometheus.Labels{"harvest": w.cfg.Name},
	}, func() float64 {
		if err, checked := w.readiness(); err == nil && !checked.IsZero() {
			return 1
		}
		return 0
	})
	return gauge, ready
}

// run checks readiness and samples the counters every w.every until ctx ends, on the process's
// wake grid: the watches of a reaper's outboxes check together.
func (w *watch) run(ctx context.Context) {
	for {
		w.check(ctx)
		if !wakegrid.Wait(ctx, w.every) {
			return
		}
	}
}

func (w *watch) check(ctx context.Context) {
	readyCtx, cancel := context.WithTimeout(ctx, ReadyzTimeout)
	err := w.h.Ready(readyCtx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	s := counterSample{at: time.Now()}
	if families, gerr := w.registry.Gather(); gerr == nil {
		s.marked = sum(families, "goharvest_records_marked_total", w.cfg.Name)
		s.published = sum(families, "goharvest_records_published_total", w.cfg.Name)
		s.purged = sum(families, "goharvest_records_purged_total", w.cfg.Name)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ready, w.checked = err, s.at
	w.samples = append(w.samples, s)
	for len(w.samples) > 0 && s.at.Sub(w.samples[0].at) > chartSpan {
		w.samples = w.samples[1:]
	}
}

// readiness returns the last readiness check's answer and when it was made (zero before the
// first); a harvester that stopped on an error is not ready, for that reason, from then on.
func (w *watch) readiness() (error, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stop != nil {
		return fmt.Errorf("stopped: %w", w.stop), time.Now()
	}
	return w.ready, w.checked
}

// stopped records why the harvester stopped (nil after a clean stop).
func (w *watch) stopped(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stop = err
}

// stopErr returns why the harvester stopped on an error, or nil.
func (w *watch) stopErr() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stop
}

func (w *watch) counterSamples() []counterSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]counterSample(nil), w.samples...)
}

// sum adds up a metric's series (counters or gauges) of harvester harvest in families.
func sum(families []*dto.MetricFamily, name, harvest string) float64 {
	var total float64
	for _, v := range byLabel(families, name, "", harvest) {
		total += v
	}
	return total
}

// byLabel returns the values of a metric of harvester harvest (its label harvest) keyed by the
// value of one label ("" for every series when label is "").
func byLabel(families []*dto.MetricFamily, name, label, harvest string) map[string]float64 {
	values := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			key, ours := "", false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					key = lp.GetValue()
				}
				if lp.GetName() == "harvest" && lp.GetValue() == harvest {
					ours = true
				}
			}
			if !ours {
				continue
			}
			switch {
			case m.GetCounter() != nil:
				values[key] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				values[key] += m.GetGauge().GetValue()
			}
		}
	}
	return values
}

// recentLog keeps the last warnings and errors the reaper logged, for the status page.
type recentLog struct {
	mu      sync.Mutex
	entries []logEntry
}

type logEntry struct {
	Time    time.Time
	Level   string
	Message string
	Attrs   string
}

const recentLogSize = 20

func (l *recentLog) add(e logEntry) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.entries = append(l.entries, e)
	if len(l.entries) > recentLogSize {
		l.entries = l.entries[len(l.entries)-recentLogSize:]
	}
}

// newest returns the entries, newest first.
func (l *recentLog) newest() []logEntry {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]logEntry, len(l.entries))
	for i, e := range l.entries {
		out[len(out)-1-i] = e
	}
	return out
}

// capture is a slog.Handler that passes every record on and keeps those at warn level or above
// in a recentLog. With hideKeys, it leaves out the attribute "key" (a held record's Kafka key),
// as the status page leaves out held records' keys.
type capture struct {
	next     slog.Handler
	log      *recentLog
	hideKeys bool
	attrs    []slog.Attr
	group    string
}

func (c *capture) Enabled(ctx context.Context, level slog.Level) bool {
	return c.next.Enabled(ctx, level)
}

func (c *capture) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		var b strings.Builder
		write := func(a slog.Attr) bool {
			if c.hideKeys && a.Key == "key" {
				return true
			}
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%s=%v", a.Key, a.Value.Resolve())
			return true
		}
		for _, a := range c.attrs {
			write(a)
		}
		r.Attrs(func(a slog.Attr) bool {
			if c.group != "" {
				a.Key = c.group + "." + a.Key
			}
			return write(a)
		})
		c.log.add(logEntry{Time: r.Time, Level: r.Level.String(), Message: r.Message, Attrs: b.String()})
	}
	return c.next.Handle(ctx, r)
}

func (c *capture) WithAttrs(attrs []slog.Attr) slog.Handler {
	next := *c
	next.next = c.next.WithAttrs(attrs)
	next.attrs = append(append([]slog.Attr(nil), c.attrs...), attrs...)
	if c.group != "" {
		for i := len(c.attrs); i < len(next.attrs); i++ {
			next.attrs[i].Key = c.group + "." + next.attrs[i].Key
		}
	}
	return &next
}

func (c *capture) WithGroup(name string) slog.Handler {
	next := *c
	next.next = c.next.WithGroup(name)
	if c.group != "" {
		name = c.group + "." + name
	}
	next.group = name
	return &next
}
