package embed_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/testlog"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/internal/testkit/verifytest"
	"github.com/goharvest/goharvest/internal/wakegrid"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// intRig is a real outbox on Postgres and Apache Kafka: the package's shared cluster, in which
// each rig has a topic and election groups of its own, or a cluster of the test's own.
type intRig struct {
	t     *testing.T
	dsn   string
	pool  *pgxpool.Pool
	addr  string // Kafka's bootstrap servers
	id    string // sets this rig's topic and groups apart from other tests'
	topic string
	run   string
}

var rigs atomic.Int64

// newIntRig is a rig on the package's shared Kafka cluster.
func newIntRig(t *testing.T) *intRig {
	t.Helper()
	return newIntRigOn(t, kafkacluster.Shared(t))
}

// newIntRigOn is a rig on the Kafka cluster c.
func newIntRigOn(t *testing.T, c *kafkacluster.Cluster) *intRig {
	t.Helper()
	r := newRig(t, fmt.Sprintf("rig%d", rigs.Add(1)), c.Addr())
	if err := c.CreateTopic(r.topic, 8); err != nil {
		t.Fatal(err)
	}
	return r
}

// newKfakeRig is a rig on kfake, for a test of a fault that only kfake can inject; the test says
// which.
func newKfakeRig(t *testing.T, opts ...kafkatest.Option) (*intRig, *kafkatest.Broker) {
	t.Helper()
	id := fmt.Sprintf("rig%d", rigs.Add(1))
	broker := kafkatest.Start(t, append(opts, kafkatest.WithTopics(8, id+".events"))...)
	return newRig(t, id, broker.Addr()), broker
}

// newRig is a rig with a database of its own, on Kafka at addr, whose topic (id.events) the
// caller creates.
func newRig(t *testing.T, id, addr string) *intRig {
	t.Helper()
	ctx := context.Background()
	r := &intRig{t: t, dsn: pgtest.NewOutbox(t), addr: addr, id: id, topic: id + ".events", run: t.Name()}
	pool, err := pgxpool.New(ctx, r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r.pool = pool
	return r
}

// load stashes perKey stamped records for each of keys keys, in sequence order, and returns the
// count per key to check against.
func (r *intRig) load(keys, perKey int) map[string]int64 {
	r.t.Helper()
	return verifytest.StashBacklog(r.t, r.pool, r.topic, r.run, keys, perKey, goharvest.String("payload"))
}

func (r *intRig) outboxRows() int {
	var n int
	if err := r.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

// store returns a Postgres store of the rig's outbox, which the harvester given it disposes.
func (r *intRig) store() *postgres.Store {
	r.t.Helper()
	store, err := postgres.New(r.dsn, "outbox")
	if err != nil {
		r.t.Fatal(err)
	}
	return store
}

func (r *intRig) harvester(events *eventRecorder) *goharvest.Harvest {
	r.t.Helper()
	h := r.harvesterWith("harvest-int", goharvest.Limits{IOErrorBackoff: 50 * time.Millisecond}, nil)
	if events != nil {
		h.SetEventHandler(events.record)
	}
	return h
}

// kafkaClients are the Kafka clients that tests about both run on, the default first.
var kafkaClients = []reaper.KafkaClient{reaper.KafkaClientFranz, reaper.KafkaClientLibrdkafka}

// testKafkaClient is the Kafka client the rig's harvesters use unless a test chooses one:
// GOHARVEST_TEST_KAFKA_CLIENT's ("librdkafka" or "franz"), as in int/, or the default.
func testKafkaClient() reaper.KafkaClient {
	return reaper.KafkaClient(os.Getenv("GOHARVEST_TEST_KAFKA_CLIENT"))
}

// harvestSettings are a test harvester's settings: the reaper's, which make its drivers (the
// Kafka client a test names, the Postgres store), and a wrapper of the store, for tests that
// inject faults into it.
type harvestSettings struct {
	reaper.Settings
	wrapStore func(*postgres.Store) driver.DatabaseBinding
}

// harvesterWith returns a harvester in the election group named group, with a 1 s heartbeat
// timeout and frequent polls unless limits say otherwise, and its metrics in registry (a
// registry of its own if nil).
func (r *intRig) harvesterWith(group string, limits goharvest.Limits, registry prometheus.Registerer, adjust ...func(*harvestSettings)) *goharvest.Harvest {
	r.t.Helper()
	if limits.HeartbeatTimeout == 0 {
		limits.HeartbeatTimeout = time.Second
	}
	if limits.MinPollInterval == 0 {
		limits.MinPollInterval = 50 * time.Millisecond
	}
	if registry == nil {
		registry = prometheus.NewRegistry()
	}
	group = r.id + "." + group
	s := harvestSettings{Settings: reaper.Settings{
		Config: goharvest.Config{
			LeaderGroupID:     group,
			LeaderTopic:       group + ".leader",
			Name:              group,
			Limits:            limits,
			MetricsRegisterer: registry,
			Logger:            testlog.Logger(),
		},
		KafkaClient:     testKafkaClient(),
		BaseKafkaConfig: reaper.KafkaConfigMap{"bootstrap.servers": r.addr},
		DataSource:      r.dsn,
	}}
	for _, f := range adjust {
		f(&s)
	}
	return newTestHarvester(r.t, s)
}

// newTestHarvester makes a harvester with the drivers s makes, its store wrapped as s says.
func newTestHarvester(t testing.TB, s harvestSettings) *goharvest.Harvest {
	t.Helper()
	cfg, err := s.HarvestConfig()
	if err != nil {
		t.Fatal(err)
	}
	if s.wrapStore != nil {
		cfg.Store = s.wrapStore(cfg.Store.(*postgres.Store))
	}
	h, err := goharvest.New(cfg)
	if err != nil {
		cfg.Store.Dispose()
		t.Fatal(err)
	}
	return h
}

func (r *intRig) waitEmpty(within time.Duration) {
	r.t.Helper()
	if !testwait.Until(within, func() bool { return r.outboxRows() == 0 }) {
		r.t.Fatalf("%d rows still in the outbox after %v", r.outboxRows(), within)
	}
}

// runUntilDelivered runs h until the outbox is empty and v has seen every record, then stops it.
func (r *intRig) runUntilDelivered(h *goharvest.Harvest, v *verifytest.Verifier, records int64) {
	r.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	r.waitEmpty(3 * time.Minute)
	v.WaitDistinct(r.t, records, time.Minute)
	cancel()
	if err := <-done; err != nil {
		r.t.Fatal(err)
	}
}

type eventRecorder struct {
	mu     sync.Mutex
	counts map[string]int
}

func (e *eventRecorder) record(ev event.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.counts == nil {
		e.counts = map[string]int{}
	}
	name := fmt.Sprintf("%T", ev) // the type's name, whichever package declares it
	e.counts[name[strings.LastIndex(name, ".")+1:]]++
}

func (e *eventRecorder) count(kind string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.counts[kind]
}

func (r *intRig) verifier() *verifytest.Verifier {
	return verifytest.Start(r.t, r.addr, r.topic, r.run)
}

// checkDelivered asserts that every record arrived and no key went backwards, and returns the
// number of duplicates.
func checkDelivered(t *testing.T, v *verifytest.Verifier, expected map[string]int64) int64 {
	t.Helper()
	report := v.Report(expected)
	if !report.OK() {
		t.Errorf("delivery check failed:\n%s", report)
	}
	return report.Duplicates
}

// Each claim strategy drains a backlog whole and in order, and only the mark strategy writes to
// the rows it publishes before it purges them.
func TestHarvestDrainsFiftyThousandRecordsInOrder(t *testing.T) {
	for _, strategy := range []goharvest.ClaimStrategy{goharvest.ClaimRead, goharvest.ClaimMark} {
		t.Run(string(strategy), func(t *testing.T) {
			const keys, perKey = 1000, 50
			r := newIntRig(t)
			expected := r.load(keys, perKey)
			v := r.verifier()
			updatedBefore, deletedBefore := r.rowStats()
			start := time.Now()
			h := r.harvesterWith("harvest-int", goharvest.Limits{}, nil, func(c *harvestSettings) { c.ClaimStrategy = strategy })
			r.runUntilDelivered(h, v, keys*perKey)
			t.Logf("drained and verified %d records in %v", keys*perKey, time.Since(start))
			if dups := checkDelivered(t, v, expected); dups != 0 {
				t.Errorf("%d duplicates in a run without faults", dups)
			}
			// The harvester's connections report their counts as they close; the purges, one per
			// record, say when they all have.
			var updated, deleted int64
			testwait.For(t, 10*time.Second, "the statistics to count every purge", func() bool {
				updated, deleted = r.rowStats()
				updated, deleted = updated-updatedBefore, deleted-deletedBefore
				return deleted >= keys*perKey
			})
			if strategy == goharvest.ClaimRead && updated != 0 {
				t.Errorf("the read strategy updated %d rows", updated)
			}
			if strategy == goharvest.ClaimMark && updated < keys*perKey {
				t.Errorf("the mark strategy updated %d rows, want at least one per record (%d)", updated, keys*perKey)
			}
		})
	}
}

// rowStats returns how many rows of the outbox have been updated and deleted, as
// pg_stat_user_tables counts them now.
func (r *intRig) rowStats() (updated, deleted int64) {
	r.t.Helper()
	// pg_stat_clear_snapshot drops the counts this transaction read before, if any.
	err := r.pool.QueryRow(context.Background(), `SELECT pg_stat_clear_snapshot(), n_tup_upd, n_tup_del
		FROM pg_stat_user_tables WHERE relname = 'outbox'`).Scan(nil, &updated, &deleted)
	if err != nil {
		r.t.Fatal(err)
	}
	return updated, deleted
}

// 1% of produce requests fail with an error the harvester sees (its transaction is aborted and
// the records sent again), and 1% time out after the broker stored the batch (the client
// retries; idempotence must drop the copy). kfake only: a real broker fails no chosen request. With one record per key in flight, even a consumer
// that reads the records of aborted transactions sees nothing worse than repeats; with runs, a
// consumer that reads committed records sees the same.
func TestHarvestSurvivesFailedProduceRequests(t *testing.T) {
	cases := []struct {
		name      string
		keys      int
		maxKeyRun int
		verifier  func(testing.TB, string, string, string) *verifytest.Verifier
	}{
		{"one per key, read uncommitted", 500, 1, verifytest.StartUncommitted},
		{"runs, read committed", 50, 100, verifytest.Start},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			perKey := 20000 / c.keys
			r, broker := newKfakeRig(t)
			expected := r.load(c.keys, perKey)
			v := c.verifier(t, r.addr, r.topic, r.run)
			visible := broker.FailProduce(100, kerr.UnknownServerError)
			timedOut := broker.FailProduce(100, kerr.RequestTimedOut)
			events := &eventRecorder{}
			h := r.harvesterWith("harvest-int", goharvest.Limits{IOErrorBackoff: 50 * time.Millisecond, MaxKeyRun: c.maxKeyRun}, nil)
			h.SetEventHandler(events.record)
			r.runUntilDelivered(h, v, int64(c.keys*perKey))
			dups := checkDelivered(t, v, expected)
			t.Logf("faults: %d visible, %d timed out; remarks: %d; duplicates: %d",
				visible.Hits(), timedOut.Hits(), events.count("LeaderRefreshed"), dups)
			if visible.Hits() == 0 || timedOut.Hits() == 0 {
				t.Fatal("the faults were never injected")
			}
		})
	}
}

// failingPurges is a Postgres binding whose purges succeed until one would delete a run, two or
// more records of one key: from then on every purge fails, as if the leader had stopped between
// a commit and its purge. (A key's next run waits for its last run's purge, so two of its
// records in one purge were committed in one transaction, and the note lists all but the last.)
type failingPurges struct {
	*postgres.Store
	pool    *pgxpool.Pool
	failing atomic.Bool
	purged  atomic.Int64
}

func (b *failingPurges) Purge(ctx context.Context, ids []int64) (int, error) {
	if !b.failing.Load() {
		var run bool
		if err := b.pool.QueryRow(ctx, "SELECT count(DISTINCT kafka_key) < count(*) FROM outbox WHERE id = ANY($1)", ids).Scan(&run); err != nil {
			return 0, err
		}
		if run {
			b.failing.Store(true)
		}
	}
	if b.failing.Load() {
		return 0, errors.New("injected purge failure")
	}
	n, err := b.Store.Purge(ctx, ids)
	b.purged.Add(int64(n))
	return n, err
}

// A leader whose runs commit but whose purges then all fail is stopped; its successor must purge
// the records the note lists, so that a consumer sees at most the last record of each run again,
// never a key going backwards.
func TestHarvestNextEpochPurgesNotedRecords(t *testing.T) {
	const keys, perKey = 5, 400
	r := newIntRig(t)
	expected := r.load(keys, perKey)
	v := r.verifier()
	limits := goharvest.Limits{IOErrorBackoff: 50 * time.Millisecond, MaxKeyRun: 100}
	binding := &failingPurges{pool: r.pool}
	first := r.harvesterWith("harvest-int", limits, nil, func(c *harvestSettings) {
		c.wrapStore = func(pg *postgres.Store) driver.DatabaseBinding {
			binding.Store = pg
			return binding
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- first.Run(ctx) }()
	if !testwait.Until(30*time.Second, binding.failing.Load) {
		t.Fatalf("no purge carried a run within 30s (%d records purged one per key)", binding.purged.Load())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	left := r.outboxRows()
	if want := keys*perKey - int(binding.purged.Load()); left != want {
		t.Fatalf("%d rows left, want %d: only the purges before the first run's should have deleted any", left, want)
	}

	r.runUntilDelivered(r.harvesterWith("harvest-int", limits, nil), v, keys*perKey)
	dups := checkDelivered(t, v, expected)
	t.Logf("%d records purged before purges failed; %d published again", binding.purged.Load(), dups)
	if dups > keys {
		t.Errorf("%d records published again; want at most the last of each key's run (%d)", dups, keys)
	}
}

func TestHarvestStopMidRunThenStartAgain(t *testing.T) {
	const keys, perKey = 500, 40
	r := newIntRig(t)
	expected := r.load(keys, perKey)
	v := r.verifier()

	first := r.harvester(nil)
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, time.Minute, "a third of the outbox to drain", func() bool { return r.outboxRows() <= keys*perKey*2/3 })
	first.Stop()
	if err := first.Await(); err != nil {
		t.Fatal(err)
	}
	left := r.outboxRows()
	if left == 0 {
		t.Fatal("the first harvester finished before it was stopped")
	}
	t.Logf("stopped with %d rows left", left)

	r.runUntilDelivered(r.harvester(nil), v, keys*perKey)
	t.Logf("duplicates: %d", checkDelivered(t, v, expected))
}

// A traceparent written with the record arrives unchanged on the consumed message, and with a
// tracer provider the harvester records one publish span per record, linked to that trace.
func TestTraceContextRoundTrip(t *testing.T) {
	r := newIntRig(t)
	ctx := context.Background()
	traceID, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	spanID, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	written := trace.ContextWithSpanContext(ctx, trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: traceID, SpanID: spanID, TraceFlags: trace.FlagsSampled, Remote: true}))
	rec := verify.Record(r.topic, "traced", r.run, 0, goharvest.String("v"))
	rec.KafkaHeaders = append(rec.KafkaHeaders, stasher.TraceHeaders(written)...)
	st, _ := stasher.New("outbox")
	if err := st.StashPgx(ctx, r.pool, rec); err != nil {
		t.Fatal(err)
	}

	spans := tracetest.NewSpanRecorder()
	h, err := goharvest.New(goharvest.Config{
		Store:          r.store(),
		Kafka:          franz.New(franz.Config{SeedBrokers: []string{r.addr}}),
		LeaderGroupID:  r.id + ".trace-int",
		LeaderTopic:    r.id + ".trace-int.leader",
		Limits:         goharvest.Limits{HeartbeatTimeout: time.Second, MinPollInterval: 50 * time.Millisecond},
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
		Logger:         testlog.Logger(),
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- h.Run(runCtx) }()

	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(r.addr, ",")...), kgo.ConsumeTopics(r.topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var got string
	pollCtx, stopPoll := context.WithTimeout(ctx, 30*time.Second)
	defer stopPoll()
	for got == "" && pollCtx.Err() == nil {
		cl.PollFetches(pollCtx).EachRecord(func(m *kgo.Record) {
			for _, hd := range m.Headers {
				if hd.Key == "traceparent" {
					got = string(hd.Value)
				}
			}
		})
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if want := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"; got != want {
		t.Fatalf("consumed traceparent %q, want %q", got, want)
	}
	ended := spans.Ended()
	if len(ended) != 1 || ended[0].Name() != "publish "+r.topic || len(ended[0].Links()) != 1 ||
		ended[0].Links()[0].SpanContext.TraceID() != traceID || ended[0].SpanKind() != trace.SpanKindProducer {
		t.Fatalf("spans %v; want one producer span linked to trace %s", ended, traceID)
	}
}

// After a real run, the metrics agree with what was delivered.
func TestMetricsMatchDeliveries(t *testing.T) {
	const keys, perKey = 100, 50
	r := newIntRig(t)
	r.load(keys, perKey)
	v := r.verifier()
	registry := prometheus.NewRegistry()
	h := r.harvesterWith("metrics-int", goharvest.Limits{BacklogSampleInterval: 100 * time.Millisecond}, registry)
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { h.Stop(); h.Await() }()
	r.waitEmpty(time.Minute)
	v.WaitDistinct(t, keys*perKey, time.Minute)
	// A backlog sample after the drain; should none come, the comparison below says so.
	testwait.Until(5*time.Second, func() bool { return gathered(t, registry, "goharvest_outbox_backlog_records") == 0 })
	values := map[string]float64{}
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				values[f.GetName()] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				values[f.GetName()] = m.GetGauge().GetValue()
			}
		}
	}
	want := map[string]float64{
		"goharvest_records_published_total": keys * perKey,
		"goharvest_records_purged_total":    keys * perKey,
		"goharvest_leader":                  1,
		"goharvest_leader_elections_total":  1,
		"goharvest_in_flight_records":       0,
		"goharvest_outbox_backlog_records":  0,
	}
	for name, w := range want {
		if values[name] != w {
			t.Errorf("%s = %v, want %v", name, values[name], w)
		}
	}
	if values["goharvest_records_marked_total"] < keys*perKey {
		t.Errorf("marked %v records, fewer than the %d published", values["goharvest_records_marked_total"], keys*perKey)
	}
}

// TestNotificationWakesIdleHarvester checks that a record written to an idle outbox is published
// on the notification, not at the next poll: polling is slowed to once a minute, so only the
// notification can bring the record out within seconds. With the trigger dropped the record waits,
// until a writer notifies by hand.
func TestNotificationWakesIdleHarvester(t *testing.T) {
	r := newIntRig(t)
	ctx := context.Background()
	h := r.harvesterWith("harvest-notify", goharvest.Limits{MarkBackoff: time.Minute, MaxMarkBackoff: time.Minute}, nil)
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { h.Stop(); h.Await() }()
	testwait.For(t, 30*time.Second, "leadership", h.IsLeader)
	// Past the first empty mark: the marker now sleeps a minute. Nothing signals that it has
	// started that sleep, so the test leaves it time.
	time.Sleep(500 * time.Millisecond)

	r.load(1, 1)
	r.waitEmpty(5 * time.Second)

	// The listener asks whether the trigger is still there once no notification has come for at
	// most 10s (driver/postgres's listenCheckInterval), then on the process's wake grid every 10s,
	// and a check that finds it gone has the marker poll again, as it must. The stretch below
	// starts just after a check on the grid, past the one the last notification leads to, so
	// that no check falls in it.
	time.Sleep(time.Until(wakegrid.Next(time.Now().Add(10*time.Second), 10*time.Second)) + 500*time.Millisecond)
	if _, err := r.pool.Exec(ctx, "DROP TRIGGER goharvest_notify ON outbox"); err != nil {
		t.Fatal(err)
	}
	r.load(1, 1)
	// A stretch in which, without a notification, the record must wait.
	if !testwait.Throughout(3*time.Second, 50*time.Millisecond, func() bool { return r.outboxRows() == 1 }) {
		t.Fatalf("%d rows in the outbox without a notification; want the record still waiting", r.outboxRows())
	}
	if _, err := r.pool.Exec(ctx, "SELECT pg_notify($1, '')", outbox.NotifyChannel("outbox")); err != nil {
		t.Fatal(err)
	}
	r.waitEmpty(5 * time.Second)
}

// With dead letters on, a row Kafka cannot take is moved, with its failure, into the dead-letter
// table after the configured attempts, and its key's next record is published; the moved row is
// never published.
func TestHarvestDeadLettersARefusedRow(t *testing.T) {
	r := newIntRig(t)
	ctx := context.Background()
	insert := func(topic, value string) int64 {
		var id int64
		err := r.pool.QueryRow(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			VALUES (now(), $1, 'k', $2, '{}', '{}') RETURNING id`, topic, value).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	bad := insert("not a topic!", "bad")
	insert(r.topic, "next")
	events := &eventRecorder{}
	h := r.harvesterWith("dead-letter", goharvest.Limits{IOErrorBackoff: 20 * time.Millisecond, DeadLetterAttempts: 3,
		HeldCheckInterval: 50 * time.Millisecond}, nil)
	h.SetEventHandler(events.record)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- h.Run(runCtx) }()
	r.waitEmpty(time.Minute)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var (
		errText            string
		attempts           int
		first, last, moved time.Time
	)
	err := r.pool.QueryRow(ctx, `SELECT error, attempts, first_failure_time, last_failure_time, dead_letter_time
		FROM outbox_dead_letters WHERE id = $1 AND kafka_value = 'bad'`, bad).Scan(&errText, &attempts, &first, &last, &moved)
	if err != nil {
		t.Fatalf("record %d not in the dead-letter table: %v", bad, err)
	}
	if attempts != 3 || !strings.Contains(errText, "refused by goharvest") || last.Before(first) || moved.Before(last) {
		t.Errorf("dead letter: attempts %d, error %q, failures %v..%v, moved %v", attempts, errText, first, last, moved)
	}
	if n := events.count("RecordDeadLettered"); n != 1 {
		t.Errorf("%d RecordDeadLettered events, want 1", n)
	}
	values := consumeValues(t, r.addr, r.topic, 1)
	if fmt.Sprint(values) != "[next]" {
		t.Errorf("published %v, want only the record behind the dead letter", values)
	}
}

// consumeValues reads n committed records from the start of topic, and whatever follows within
// a second, and returns their values.
func consumeValues(t *testing.T, addr, topic string, n int) []string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(addr, ",")...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var values []string
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(values) < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) { values = append(values, string(rec.Value)) })
	}
	more, cancelMore := context.WithTimeout(context.Background(), time.Second)
	defer cancelMore()
	cl.PollFetches(more).EachRecord(func(rec *kgo.Record) { values = append(values, string(rec.Value)) })
	return values
}
