package goharvest

import (
	"errors"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the harvester's Prometheus metrics. Each carries a constant "harvest" label (the
// harvester's Name), so that several harvesters can share one registry.
type metrics struct {
	leader                             prometheus.Gauge
	marked, published, purged          prometheus.Counter
	reset, failed, markedAgain         prometheus.Counter
	elections, fences, remarks         prometheus.Counter
	errors                             *prometheus.CounterVec
	markSeconds, purgeSeconds          prometheus.Histogram
	commitSeconds                      prometheus.Histogram
	backlog, oldestAge                 prometheus.Gauge
	inFlightRecords, inFlightKeysGauge prometheus.GaugeFunc
	deadLettered, heldDeleted          prometheus.Counter
	heldRecords, heldOldestAge         prometheus.GaugeFunc
	shards                             prometheus.Collector // per shard; set by New
}

// Error kinds counted by goharvest_errors_total.
const (
	errorKindDatabase = "database"
	errorKindKafka    = "kafka"
)

func newMetrics(name string, inFlight func() ([]string, int), held func() (int, time.Time)) *metrics {
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
	return &metrics{
		leader:    gauge("leader", "1 while this harvester is the leader and publishing, else 0."),
		marked:    counter("records_marked_total", "Records marked for publishing."),
		published: counter("records_published_total", "Records committed to Kafka."),
		purged:    counter("records_purged_total", "Records deleted from the outbox after publishing."),
		reset:     counter("records_reset_total", "Records reset to be marked again after a failure."),
		failed:    counter("records_failed_total", "Failed attempts to publish a record that Kafka refused or that is malformed."),
		markedAgain: counter("records_marked_again_total",
			"Records a mark returned while the leader already held them, because a deposed leader had marked them; dropped, not published twice."),
		elections: counter("leader_elections_total", "Times this harvester became the leader."),
		fences:    counter("leader_fences_total", "Times this harvester fenced itself after losing contact with Kafka."),
		remarks:   counter("remarks_total", "Times the leader moved to a new leader ID to mark records again."),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "goharvest_errors_total",
			Help: "Errors talking to the database or Kafka, by kind.", ConstLabels: labels}, []string{"kind"}),
		markSeconds:   histogram("mark_duration_seconds", "Time taken by one mark query."),
		purgeSeconds:  histogram("purge_duration_seconds", "Time taken by one purge statement."),
		commitSeconds: histogram("commit_duration_seconds", "Time taken to commit one Kafka transaction (producing its records included)."),
		backlog:       gauge("outbox_backlog_records", "Records in the outbox (counted up to 1,000,000), sampled by the leader."),
		oldestAge:     gauge("outbox_oldest_record_age_seconds", "Age of the oldest record in the outbox, sampled by the leader; 0 when empty."),
		inFlightRecords: gaugeFunc("in_flight_records", "Records marked and not yet purged, except held keys' records: what maxInFlightRecords bounds.",
			func() float64 { _, n := inFlight(); return float64(n) }),
		inFlightKeysGauge: gaugeFunc("in_flight_keys", "Keys with a record counted by goharvest_in_flight_records.",
			func() float64 { keys, _ := inFlight(); return float64(len(keys)) }),
		deadLettered: counter("records_dead_lettered_total", "Held records moved into the dead-letter table (see Limits.DeadLetterAttempts and DeadLetterAfter)."),
		heldDeleted:  counter("held_records_deleted_total", "Held records dropped because their rows were deleted (or given another key) in the outbox."),
		heldRecords: gaugeFunc("held_records", "Records that hold back their keys: refused, or malformed, and being retried.",
			func() float64 { n, _ := held(); return float64(n) }),
		heldOldestAge: gaugeFunc("held_record_oldest_age_seconds", "Time since the oldest held record first failed; 0 when none is held.",
			func() float64 {
				if _, since := held(); !since.IsZero() {
					return time.Since(since).Seconds()
				}
				return 0
			}),
	}
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.leader, m.marked, m.published, m.purged, m.reset, m.failed,
		m.markedAgain, m.elections, m.fences, m.remarks, m.errors, m.markSeconds, m.purgeSeconds, m.commitSeconds,
		m.backlog, m.oldestAge, m.inFlightRecords, m.inFlightKeysGauge,
		m.deadLettered, m.heldDeleted, m.heldRecords, m.heldOldestAge, m.shards}
}

// register adds every metric to r. A metric registered already (by a harvester of the same
// name, say) is an error: two harvesters must not share a name.
func (m *metrics) register(r prometheus.Registerer) error {
	var errs []error
	for _, c := range m.collectors() {
		errs = append(errs, r.Register(c))
	}
	return errors.Join(errs...)
}

// unregister removes the metrics again, so that a stopped harvester can be replaced.
func (m *metrics) unregister(r prometheus.Registerer) {
	for _, c := range m.collectors() {
		r.Unregister(c)
	}
}

// shardCollector reports, for each shard this harvester publishes, its in-flight records and
// its backlog, labelled by shard, and goharvest_shard_leader for every shard (1 where this
// harvester publishes it): read at collection time from the shards' owners, so never stale.
type shardCollector struct {
	h                         *Harvest
	leader, inFlight, backlog *prometheus.Desc
}

func newShardCollector(name string, h *Harvest) *shardCollector {
	labels := prometheus.Labels{"harvest": name}
	desc := func(metric, help string) *prometheus.Desc {
		return prometheus.NewDesc("goharvest_shard_"+metric, help, []string{"shard"}, labels)
	}
	return &shardCollector{
		h:        h,
		leader:   desc("leader", "1 while this harvester publishes the shard, else 0."),
		inFlight: desc("in_flight_records", "The shard's records in flight (see goharvest_in_flight_records), where this harvester publishes it."),
		backlog:  desc("outbox_backlog_records", "The shard's records in the outbox (counted up to 1,000,000), sampled where this harvester publishes it."),
	}
}

func (c *shardCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.leader
	ch <- c.inFlight
	ch <- c.backlog
}

func (c *shardCollector) Collect(ch chan<- prometheus.Metric) {
	c.h.mu.Lock()
	shards := c.h.shards
	epochs := make([]*pipeline, len(shards))
	for i, s := range shards {
		epochs[i] = s.pipeline
	}
	c.h.mu.Unlock()
	for i, s := range shards {
		label := strconv.Itoa(s.id)
		led := 0.0
		if p := epochs[i]; p != nil {
			led = 1
			_, n := p.inFlight()
			ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(n), label)
			if b := s.backlog.Load(); b >= 0 {
				ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(b), label)
			}
		}
		ch <- prometheus.MustNewConstMetric(c.leader, prometheus.GaugeValue, led, label)
	}
}
