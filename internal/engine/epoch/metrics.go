package epoch

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the harvester's Prometheus metrics. Each carries a constant "harvest" label (the
// harvester's Name), so that several harvesters can share one registry.
type Metrics struct {
	Leader                             prometheus.Gauge
	Marked, Published, Purged          prometheus.Counter
	Reset, Failed, MarkedAgain         prometheus.Counter
	Elections, Fences, Remarks         prometheus.Counter
	Errors                             *prometheus.CounterVec
	MarkSeconds, PurgeSeconds          prometheus.Histogram
	CommitSeconds                      prometheus.Histogram
	Backlog, OldestAge                 prometheus.Gauge
	InFlightRecords, InFlightKeysGauge prometheus.GaugeFunc
	DeadLettered, HeldDeleted          prometheus.Counter
	HeldRecords, HeldOldestAge         prometheus.GaugeFunc
	// Shards reports per shard (package owner's); set by the owner before Register.
	Shards prometheus.Collector
}

// Error kinds counted by goharvest_errors_total.
const (
	ErrorKindDatabase = "database"
	ErrorKindKafka    = "kafka"
)

// NewMetrics makes the metrics of the harvester called name; inFlight and held are read when the
// gauges are collected.
func NewMetrics(name string, inFlight func() ([]string, int), held func() (int, time.Time)) *Metrics {
	labels := prometheus.Labels{"harvest": name}
	counter := func(metric, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "goharvest_" + metric, Help: help, ConstLabels: labels})
	}
	gauge := func(metric, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: "goharvest_" + metric, Help: help, ConstLabels: labels})
	}
	gaugeFunc := func(metric, help string, value func() float64) prometheus.GaugeFunc {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "goharvest_" + metric, Help: help, ConstLabels: labels}, value)
	}
	histogram := func(metric, help string) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "goharvest_" + metric, Help: help, ConstLabels: labels,
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}})
	}
	return &Metrics{
		Leader:    gauge("leader", "1 while this harvester is the leader and publishing, else 0."),
		Marked:    counter("records_marked_total", "Records claimed for publishing: marked, or read (claimStrategy read)."),
		Published: counter("records_published_total", "Records committed to Kafka."),
		Purged:    counter("records_purged_total", "Records deleted from the outbox after publishing."),
		Reset:     counter("records_reset_total", "Records reset to be marked again after a failure."),
		Failed:    counter("records_failed_total", "Failed attempts to publish a record that Kafka refused or that is malformed."),
		MarkedAgain: counter("records_marked_again_total",
			"Records a mark returned while the leader already held them, because a deposed leader had marked them; dropped, not published twice."),
		Elections: counter("leader_elections_total", "Times this harvester became the leader."),
		Fences:    counter("leader_fences_total", "Times this harvester fenced itself after losing contact with Kafka."),
		Remarks:   counter("remarks_total", "Times the leader moved to a new leader ID to mark records again."),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "goharvest_errors_total",
			Help: "Errors talking to the database or Kafka, by kind.", ConstLabels: labels}, []string{"kind"}),
		MarkSeconds:   histogram("mark_duration_seconds", "Time taken by one mark query."),
		PurgeSeconds:  histogram("purge_duration_seconds", "Time taken by one purge statement."),
		CommitSeconds: histogram("commit_duration_seconds", "Time taken to commit one Kafka transaction (producing its records included)."),
		Backlog:       gauge("outbox_backlog_records", "Records in the outbox (counted up to 1,000,000), sampled by the leader."),
		OldestAge:     gauge("outbox_oldest_record_age_seconds", "Age of the oldest record in the outbox, sampled by the leader; 0 when empty."),
		InFlightRecords: gaugeFunc("in_flight_records", "Records marked and not yet purged, except held keys' records: what maxInFlightRecords bounds.",
			func() float64 { _, n := inFlight(); return float64(n) }),
		InFlightKeysGauge: gaugeFunc("in_flight_keys", "Keys with a record counted by goharvest_in_flight_records.",
			func() float64 { keys, _ := inFlight(); return float64(len(keys)) }),
		DeadLettered: counter("records_dead_lettered_total", "Held records moved into the dead-letter table (see Limits.DeadLetterAttempts and DeadLetterAfter)."),
		HeldDeleted:  counter("held_records_deleted_total", "Held records dropped because their rows were deleted (or given another key) in the outbox."),
		HeldRecords: gaugeFunc("held_records", "Records that hold back their keys: refused, or malformed, and being retried.",
			func() float64 { n, _ := held(); return float64(n) }),
		HeldOldestAge: gaugeFunc("held_record_oldest_age_seconds", "Time since the oldest held record first failed; 0 when none is held.",
			func() float64 {
				if _, since := held(); !since.IsZero() {
					return time.Since(since).Seconds()
				}
				return 0
			}),
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.Leader, m.Marked, m.Published, m.Purged, m.Reset, m.Failed,
		m.MarkedAgain, m.Elections, m.Fences, m.Remarks, m.Errors, m.MarkSeconds, m.PurgeSeconds, m.CommitSeconds,
		m.Backlog, m.OldestAge, m.InFlightRecords, m.InFlightKeysGauge,
		m.DeadLettered, m.HeldDeleted, m.HeldRecords, m.HeldOldestAge, m.Shards}
}

// Register adds every metric to r. A metric registered already (by a harvester of the same
// name, say) is an error: two harvesters must not share a name.
func (m *Metrics) Register(r prometheus.Registerer) error {
	var errs []error
	for _, c := range m.collectors() {
		errs = append(errs, r.Register(c))
	}
	return errors.Join(errs...)
}

// Unregister removes the metrics again, so that a stopped harvester can be replaced.
func (m *Metrics) Unregister(r prometheus.Registerer) {
	for _, c := range m.collectors() {
		r.Unregister(c)
	}
}
