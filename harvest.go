// Package goharvest publishes the rows of a Postgres transactional outbox to Kafka, at least once,
// in per-key order, with exactly one publisher elected through Kafka.
//
// Applications write outbox rows in the same transaction as their business data (see package
// stasher, or plain SQL). A Harvest elects a leader among its peers (package neli); the leader
// marks rows from the head of the outbox, publishes them with at most one record in flight per
// key, and deletes each row once Kafka has acknowledged it. See README.md for the guarantees,
// the schema and the configuration.
//
//	h, err := goharvest.New(goharvest.Config{
//		BaseKafkaConfig: goharvest.KafkaConfigMap{"bootstrap.servers": "localhost:9092"},
//		DataSource:      "host=localhost dbname=app",
//		LeaderGroupID:   "app",
//		LeaderTopic:     "app.leader",
//	})
//	...
//	err = h.Run(ctx) // until ctx ends, or Start, Stop and Await
package goharvest

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/goharvest/goharvest/internal/dispatch"
	"github.com/goharvest/goharvest/metric"
	"github.com/goharvest/goharvest/neli"
)

// TransactionalIDPrefix is put before LeaderGroupID to make the producers' transactional ID,
// which every harvester of an outbox shares (see KafkaProducer).
const TransactionalIDPrefix = "goharvest."

// NoteGroupSuffix is put after LeaderGroupID to make the consumer group in which transactions
// leave their notes (see NotePlace). The producer's principal needs Read on this group.
const NoteGroupSuffix = ".notes"

// State is a Harvest's place in its lifecycle.
type State int

const (
	// Created: configured, not started.
	Created State = iota
	// Running: started.
	Running
	// Stopping: Stop was called (or a fatal error happened); work is winding down.
	Stopping
	// Stopped: everything has been released.
	Stopped
)

func (s State) String() string {
	return [...]string{"created", "running", "stopping", "stopped"}[s]
}

// Harvest publishes an outbox table to Kafka. Create it with New, then Run it, or Start it and
// later Stop and Await it. It runs once.
type Harvest struct {
	cfg            Config
	producerConfig KafkaConfigMap
	log            *slog.Logger
	meter          *metric.Meter
	metrics        *metrics
	dbTrouble      *episode
	kafkaTrouble   *episode
	notifyTrouble  *episode
	lastPulse      atomic.Int64 // Unix nanoseconds of the owner loop's latest pulse
	failures       *failureMemo // held records' failures, across epochs

	mu       sync.Mutex // guards the fields below
	state    State
	handler  EventHandler
	events   *dispatch.Dispatcher[Event]
	db       DatabaseBinding
	elector  Elector
	pipeline *pipeline // the current epoch; nil while not leading
	// schemaProblem is the last schema mismatch reported by an epoch start, "" when the table fits:
	// the elected leader cannot publish meanwhile, which Ready says.
	schemaProblem string
	err           error // what stopped the harvester

	// Owned by the owner goroutine (run):
	starting   *epochStart     // an epoch being prepared, if any
	prevClosed <-chan struct{} // closed once the last epoch's producer has closed
	unpurged   []int64         // records the last epoch published and could not purge

	stopOnce sync.Once
	stopCh   chan struct{}
	done     chan struct{}
}

// New validates the config (after applying defaults to a copy) and returns a harvester ready
// to start. It does not connect to anything.
func New(config Config) (*Harvest, error) {
	cfg := config.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	producerConfig := maps.Clone(cfg.BaseKafkaConfig)
	maps.Copy(producerConfig, cfg.ProducerKafkaConfig)
	if _, ok := cfg.ProducerKafkaConfig["client.id"]; !ok {
		producerConfig["client.id"] = cfg.Name
	}
	_, hasMessageTimeout := producerConfig["message.timeout.ms"]
	_, hasDeliveryTimeout := producerConfig["delivery.timeout.ms"]
	if !hasMessageTimeout && !hasDeliveryTimeout {
		producerConfig["message.timeout.ms"] = int(cfg.Limits.QueueTimeout.Milliseconds())
	}
	if _, ok := producerConfig["transaction.timeout.ms"]; !ok {
		producerConfig["transaction.timeout.ms"] = int(cfg.transactionTimeout().Milliseconds())
	}
	_, hasLinger := producerConfig["linger.ms"]
	_, hasLingerAlias := producerConfig["queue.buffering.max.ms"]
	if !hasLinger && !hasLingerAlias {
		// The transaction loop already gathers records between commits, and a commit sends what is
		// queued at once; librdkafka's own 5 ms wait would only delay each delivery report, and
		// with it the commit that releases a key's next record.
		producerConfig["linger.ms"] = DefaultProducerLinger
	}
	setDefaultPartitioner(producerConfig)
	maps.Copy(producerConfig, KafkaConfigMap{
		"enable.idempotence":  true,
		"acks":                "all",
		"go.delivery.reports": true,
		"transactional.id":    TransactionalIDPrefix + cfg.LeaderGroupID,
	})
	h := &Harvest{
		cfg:            cfg,
		producerConfig: producerConfig,
		log:            cfg.Logger.With("harvest", cfg.Name),
		state:          Created,
		stopCh:         make(chan struct{}),
		done:           make(chan struct{}),
		failures:       &failureMemo{},
	}
	h.metrics = newMetrics(cfg.Name, h.inFlight, h.heldStats)
	quiet := 3*cfg.Limits.IOErrorBackoff + time.Second
	h.dbTrouble = &episode{what: "database", failures: h.metrics.errors.WithLabelValues(errorKindDatabase),
		repeat: outageLogInterval, quiet: quiet}
	h.kafkaTrouble = &episode{what: "Kafka transactions", failures: h.metrics.errors.WithLabelValues(errorKindKafka),
		repeat: outageLogInterval, quiet: quiet}
	// Notifications only speed things up: their loss is said once, not repeated.
	h.notifyTrouble = &episode{what: "notifications of new records", meanwhile: "polling instead"}
	return h, nil
}

// SetEventHandler registers the handler for events (see Event); call it before Start.
func (h *Harvest) SetEventHandler(handler EventHandler) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handler = handler
}

// Start opens the outbox and joins the leader election, then returns; the work goes on in the
// background until Stop. It fails if the harvester was started before or cannot be set up.
func (h *Harvest) Start() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != Created {
		return fmt.Errorf("harvest: cannot start in state %v", h.state)
	}
	if err := h.metrics.register(h.cfg.MetricsRegisterer); err != nil {
		h.metrics.unregister(h.cfg.MetricsRegisterer)
		return fmt.Errorf("harvest: register metrics (is another harvester named %q registered?): %w", h.cfg.Name, err)
	}
	db, err := h.cfg.DatabaseBindingProvider(h.cfg.DataSource, h.cfg.OutboxTable)
	if err != nil {
		h.metrics.unregister(h.cfg.MetricsRegisterer)
		return fmt.Errorf("harvest: open outbox: %w", err)
	}
	elector, err := h.cfg.NeliProvider(neli.Config{
		KafkaConfig:      h.cfg.BaseKafkaConfig,
		LeaderTopic:      h.cfg.LeaderTopic,
		LeaderGroupID:    h.cfg.LeaderGroupID,
		Name:             h.cfg.Name,
		HeartbeatTimeout: h.cfg.Limits.HeartbeatTimeout,
		PollDuration:     h.cfg.Limits.PollDuration,
		MinPollInterval:  h.cfg.Limits.MinPollInterval,
		Barrier:          h.leadershipLost,
		Logger:           h.cfg.Logger,
	})
	if err != nil {
		db.Dispose()
		h.metrics.unregister(h.cfg.MetricsRegisterer)
		return fmt.Errorf("harvest: leader election: %w", err)
	}
	// Every instance checks the producer's settings now, rather than only the one elected, and
	// only when it is: creating a producer contacts no broker, so a failure is a bad setting.
	probe, err := h.cfg.KafkaProducerProvider(h.producerConfig)
	if err != nil {
		elector.Close(context.Background())
		db.Dispose()
		h.metrics.unregister(h.cfg.MetricsRegisterer)
		return fmt.Errorf("harvest: producer config: %w", err)
	}
	probe.Close()
	h.db, h.elector = db, elector
	h.events = dispatch.New(h.handler)
	h.meter = metric.NewMeter("throughput", h.cfg.Limits.MinMetricsInterval)
	h.state = Running
	closed := make(chan struct{})
	close(closed)
	h.prevClosed = closed
	h.lastPulse.Store(time.Now().UnixNano())
	go h.run()
	go h.sampleBacklog()
	return nil
}

// Stop asks the harvester to stop and returns at once; Await waits for it. A leader stops
// marking, waits (up to about MaxPollInterval) for the records it has in flight, and leaves the
// election so that another harvester takes over at once.
func (h *Harvest) Stop() {
	h.stopOnce.Do(func() { close(h.stopCh) })
}

// Await blocks until the harvester has stopped, and returns the error that stopped it, if
// any. It returns at once for a harvester that was never started.
func (h *Harvest) Await() error {
	h.mu.Lock()
	started := h.state != Created
	h.mu.Unlock()
	if !started {
		return nil
	}
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

// Run starts the harvester and stops it when ctx ends. It returns nil after a stop caused by
// ctx, or the error that stopped the harvester.
func (h *Harvest) Run(ctx context.Context) error {
	if err := h.Start(); err != nil {
		return err
	}
	go func() {
		select {
		case <-ctx.Done():
			h.Stop()
		case <-h.done:
		}
	}()
	return h.Await()
}

// State returns where the harvester is in its lifecycle.
func (h *Harvest) State() State {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state
}

// IsLeader reports whether this harvester is publishing now.
func (h *Harvest) IsLeader() bool { return h.LeaderID() != nil }

// LeaderID returns the ID under which this harvester is marking records, or nil when it is not
// the leader. It changes on every remark.
func (h *Harvest) LeaderID() *uuid.UUID {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.pipeline == nil {
		return nil
	}
	id := h.pipeline.leaderID
	return &id
}

// InFlightRecords returns how many records are in flight: marked and not yet purged, except the
// records of held keys (see HeldRecords) from the held one on, unless it is being sent again. It
// is the count that Limits.MaxInFlightRecords bounds (see there for how held keys can pass it).
func (h *Harvest) InFlightRecords() int {
	_, n := h.inFlight()
	return n
}

// InFlightRecordKeys returns the keys of the records counted by InFlightRecords, each once.
func (h *Harvest) InFlightRecordKeys() []string {
	keys, _ := h.inFlight()
	return keys
}

func (h *Harvest) inFlight() ([]string, int) {
	h.mu.Lock()
	p := h.pipeline
	h.mu.Unlock()
	if p == nil {
		return nil, 0
	}
	return p.inFlight()
}

func (h *Harvest) emit(e Event) { h.events.Emit(e) }

// run is the owner loop: it pulses the election and starts and ends leader epochs. Every epoch
// change happens on this goroutine (leadershipLost runs inside Pulse), so epochs never overlap.
// Starting an epoch talks to the database and to Kafka, which may be slow; it runs on a goroutine
// of its own (see epochStart) while this loop keeps pulsing, so that the group never waits on it.
func (h *Harvest) run() {
	defer close(h.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ticker := time.NewTicker(h.cfg.Limits.MinPollInterval)
	defer ticker.Stop()

	var (
		acquired    bool      // the current leadership has had an epoch already
		nextEpochAt time.Time // after an error, the next epoch waits for IOErrorBackoff
		err         error
	)
loop:
	for {
		var leading bool
		h.lastPulse.Store(time.Now().UnixNano())
		leading, err = h.elector.Pulse(ctx)
		if err != nil {
			break
		}
		if !leading {
			acquired = false
			h.abandonStart()
			if h.current() != nil {
				// The clock fenced us between pulses (neli's barrier follows when it notices).
				h.endEpoch(h.lossEvent())
			}
		} else if h.current() == nil && h.starting == nil && !time.Now().Before(nextEpochAt) {
			h.starting = h.beginEpoch(ctx)
		}
		var remark, started <-chan struct{}
		if p := h.current(); p != nil {
			remark = p.remark()
		}
		if h.starting != nil {
			started = h.starting.done
		}
		select {
		case <-h.stopCh:
		case <-remark:
			p := h.current()
			h.endEpoch(nil)
			if p.remarkErr.Load() {
				nextEpochAt = time.Now().Add(h.cfg.Limits.IOErrorBackoff)
			}
			continue
		case <-started:
			s := h.starting
			h.starting = nil
			switch {
			case s.err != nil:
				err = s.err
				break loop
			case s.producer == nil:
				nextEpochAt = time.Now().Add(h.cfg.Limits.IOErrorBackoff)
			case h.stopping() || h.elector.State() != neli.Leader:
				// Stop was called, or the clock fenced us, while the start ran.
				s.producer.Close()
			default:
				h.launchEpoch(s.producer, acquired)
				acquired = true
			}
			continue
		case <-ticker.C:
			continue
		}
		break
	}
	h.shutdown(err)
}

// stopping reports whether Stop has been called.
func (h *Harvest) stopping() bool {
	select {
	case <-h.stopCh:
		return true
	default:
		return false
	}
}

func (h *Harvest) current() *pipeline {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pipeline
}

// epochStart is an epoch being prepared on a goroutine of its own: the schema check, a new
// producer whose InitTransactions fences the producers of every earlier epoch, and the purge of
// records earlier epochs published and did not purge. It belongs to the owner goroutine.
type epochStart struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the fields below are set
	// producer is ready to publish; nil when a step failed and the start is to be retried.
	producer KafkaProducer
	// err is a failure that retrying cannot cure (Kafka refusing the harvester's settings); it
	// stops the harvester.
	err error
}

// beginEpoch starts preparing an epoch. Every step that cannot be cancelled (librdkafka's
// InitTransactions honours only a deadline) is bounded by MaxPollInterval, so that abandonStart,
// which a handover waits for, returns within that bound.
func (h *Harvest) beginEpoch(ctx context.Context) *epochStart {
	ctx, cancel := context.WithCancel(ctx)
	s := &epochStart{cancel: cancel, done: make(chan struct{})}
	prevClosed, unpurged := h.prevClosed, h.unpurged
	go func() {
		defer close(s.done)
		// The previous epoch's producer closes in the background; the next one waits for it, so
		// that one process never has two.
		select {
		case <-prevClosed:
		case <-ctx.Done():
			return
		}
		s.producer, s.err = h.prepareEpoch(ctx, unpurged)
	}()
	return s
}

// prepareEpoch runs the steps of an epoch's start and returns its producer, or nil when a step
// failed and should be retried after IOErrorBackoff.
func (h *Harvest) prepareEpoch(ctx context.Context, unpurged []int64) (KafkaProducer, error) {
	// Each step first checks that the start has not been abandoned: above all InitTransactions,
	// which would otherwise fence a leader elected meanwhile.
	if ctx.Err() != nil || !h.schemaReady(ctx) {
		return nil, nil
	}
	// Records this harvester committed to Kafka and could not purge when its last epoch ended
	// would otherwise be marked and published again.
	if len(unpurged) > 0 {
		if !h.purgeIDs(ctx, "purge records the last epoch published", unpurged) {
			return nil, nil
		}
		h.log.Info("purged records the last epoch published and could not purge", "records", len(unpurged))
	}
	if ctx.Err() != nil {
		return nil, nil
	}
	producer, err := h.cfg.KafkaProducerProvider(h.producerConfig)
	if err != nil {
		return nil, fmt.Errorf("harvest: create producer: %w", err)
	}
	if ctx.Err() != nil {
		producer.Close()
		return nil, nil
	}
	initCtx, cancel := context.WithTimeout(ctx, h.cfg.Limits.MaxPollInterval)
	err = producer.InitTransactions(initCtx)
	cancel()
	if err == nil {
		err = producer.BeginTransaction()
	}
	var refused *KafkaConfigError
	if errors.As(err, &refused) {
		producer.Close()
		return nil, fmt.Errorf("harvest: Kafka refuses the producer's settings or permissions: %w", err)
	}
	if err != nil {
		if ctx.Err() == nil {
			h.kafkaTrouble.fail(h.log, "init transactions", err)
		}
		producer.Close()
		return nil, nil
	}
	if ctx.Err() != nil || !h.purgeNoted(ctx, producer) {
		producer.Close()
		return nil, nil
	}
	// Only a start that got through every step ends an outage: a step that succeeds while a later
	// one keeps failing would otherwise end it and begin it again on every attempt, and the
	// outage would never count as lasting (for the log and for Ready).
	h.dbTrouble.ok(h.log)
	h.kafkaTrouble.ok(h.log)
	return producer, nil
}

// abandonStart cancels an epoch start under way and waits for it, closing its producer if it
// got one. It returns within about MaxPollInterval (see beginEpoch).
func (h *Harvest) abandonStart() {
	s := h.starting
	if s == nil {
		return
	}
	h.starting = nil
	s.cancel()
	<-s.done
	if s.producer != nil {
		s.producer.Close()
	}
}

// launchEpoch begins publishing under a new leader ID through a prepared producer.
func (h *Harvest) launchEpoch(producer KafkaProducer, refresh bool) {
	h.unpurged = nil
	leaderID := uuid.New()
	p := startPipeline(pipelineDeps{
		leaderID:  leaderID,
		limits:    h.cfg.Limits,
		db:        h.db,
		producer:  producer,
		log:       h.log,
		emit:      h.emit,
		meter:     h.meter,
		dbTrouble: h.dbTrouble,
		notify:    h.notifyTrouble,
		metrics:   h.metrics,
		tracer:    h.tracer(),
		leading:   func() bool { return h.elector.State() == neli.Leader },
		notes:     h.notePlace(),
		idHeader:  h.cfg.IDHeader,
		failures:  h.failures,
	})
	h.mu.Lock()
	h.pipeline = p
	h.mu.Unlock()
	h.metrics.leader.Set(1)
	if refresh {
		h.metrics.remarks.Inc()
		h.log.Info("leader refreshed", "leaderID", leaderID)
		h.emit(LeaderRefreshed{LeaderID: leaderID})
	} else {
		h.metrics.elections.Inc()
		h.log.Info("leader acquired", "leaderID", leaderID)
		h.emit(LeaderAcquired{LeaderID: leaderID})
	}
}

// notePlace is where this outbox's transactions leave their notes (see note.go).
func (h *Harvest) notePlace() NotePlace {
	return NotePlace{Group: h.cfg.LeaderGroupID + NoteGroupSuffix, Topic: h.cfg.LeaderTopic}
}

// purgeNoted purges the records that the latest committed note lists: an earlier epoch
// published them and may have stopped before purging them. InitTransactions has settled every
// earlier transaction, so the note read is final. It reports false, to be retried, when Kafka or
// the database fails.
func (h *Harvest) purgeNoted(ctx context.Context, producer KafkaProducer) bool {
	place := h.notePlace()
	readCtx, cancel := context.WithTimeout(ctx, h.cfg.Limits.MaxPollInterval)
	note, err := producer.ReadNote(readCtx, place)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			h.kafkaTrouble.fail(h.log, "read note", err)
		}
		return false
	}
	ids, err := decodeNote(note)
	if err != nil {
		// Not ours to interpret: someone else wrote to the group. Publishing on would risk a run
		// going out again whole, so wait for an operator.
		h.kafkaTrouble.fail(h.log, "read note of group "+place.Group, err)
		return false
	}
	if len(ids) == 0 {
		return true
	}
	return h.purgeIDs(ctx, "purge noted records", ids)
}

// purgeIDs deletes the rows of records that an earlier epoch published, before this one marks
// anything. It reports false, to be retried, when the database fails.
func (h *Harvest) purgeIDs(ctx context.Context, op string, ids []int64) bool {
	n := 0
	for batch := range slices.Chunk(ids, maxCommitBatch) {
		purgeCtx, cancel := context.WithTimeout(ctx, h.cfg.Limits.QueueTimeout)
		purged, err := h.db.Purge(purgeCtx, batch)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				h.dbTrouble.fail(h.log, op, err)
			}
			return false
		}
		n += purged
	}
	if n > 0 {
		h.log.Info("purged records an earlier leader published and had not purged", "records", n, "op", op)
	}
	return true
}

// schemaReady checks the outbox table's columns, if the binding can. A table the harvester
// cannot read is reported (once until it changes, with every column at fault) and publishing
// waits; an operator's ALTER TABLE is picked up on the next check.
func (h *Harvest) schemaReady(ctx context.Context) bool {
	checker, ok := h.db.(SchemaChecker)
	if !ok {
		return true
	}
	checkCtx, cancel := context.WithTimeout(ctx, h.cfg.Limits.QueueTimeout)
	defer cancel()
	err := checker.CheckSchema(checkCtx)
	var schemaErr *SchemaError
	switch {
	case errors.As(err, &schemaErr):
		h.mu.Lock()
		changed := schemaErr.Error() != h.schemaProblem
		h.schemaProblem = schemaErr.Error()
		h.mu.Unlock()
		if changed {
			h.log.Error("cannot publish: the outbox table does not fit; alter it and publishing starts", "error", err)
			h.emit(SchemaRejected{Err: err})
		}
		return false
	case err != nil:
		if ctx.Err() == nil {
			h.dbTrouble.fail(h.log, "check schema", err)
		}
		return false
	}
	h.mu.Lock()
	fixed := h.schemaProblem != ""
	h.schemaProblem = ""
	h.mu.Unlock()
	if fixed {
		h.log.Info("the outbox table fits now")
	}
	return true
}

// endEpoch drains and closes the current epoch, within about MaxPollInterval, then reports why
// it ended (nil for a remark, which LeaderRefreshed reports when the next epoch
// starts).
func (h *Harvest) endEpoch(why Event) {
	h.mu.Lock()
	p := h.pipeline
	h.mu.Unlock()
	if p != nil {
		h.metrics.leader.Set(0)
		unpurged, closed := p.stop(h.cfg.Limits.MaxPollInterval)
		h.unpurged = append(h.unpurged, unpurged...)
		h.prevClosed = closed
		h.mu.Lock()
		h.pipeline = nil
		h.mu.Unlock()
	}
	if _, fenced := why.(LeaderFenced); fenced {
		h.metrics.fences.Inc()
	}
	if why != nil {
		h.log.Info(why.String())
		h.emit(why)
	}
}

// leadershipLost is neli's Barrier: it runs on the owner goroutine, inside Pulse, when
// leadership is revoked or fenced, and the handover waits for it.
func (h *Harvest) leadershipLost() {
	h.abandonStart()
	if h.current() != nil {
		h.endEpoch(h.lossEvent())
	}
}

// lossEvent says how leadership was lost.
func (h *Harvest) lossEvent() Event {
	if h.elector.State() == neli.Fenced {
		return LeaderFenced{}
	}
	return LeaderRevoked{}
}

// shutdown ends the epoch, leaves the election and releases everything.
func (h *Harvest) shutdown(cause error) {
	h.mu.Lock()
	h.state = Stopping
	h.mu.Unlock()
	h.log.Info("stopping", "error", cause)
	h.abandonStart()
	if h.current() != nil {
		h.endEpoch(LeaderRevoked{})
	}
	closeCtx, cancel := context.WithTimeout(context.Background(), 2*h.cfg.Limits.HeartbeatTimeout)
	defer cancel()
	if err := h.elector.Close(closeCtx); err != nil {
		h.log.Warn("leave the leader election", "error", err)
	}
	select {
	case <-h.prevClosed:
	case <-closeCtx.Done():
		h.log.Warn("the last epoch's producer is still closing at shutdown")
	}
	h.db.Dispose()
	h.metrics.unregister(h.cfg.MetricsRegisterer)
	h.events.Close()
	select {
	case <-h.events.Done():
	case <-closeCtx.Done():
		h.log.Warn("event handler still busy at shutdown")
	}
	h.mu.Lock()
	h.state = Stopped
	h.err = cause
	h.mu.Unlock()
	h.log.Info("stopped")
}

// tracer returns the tracer for publish spans, or nil when no TracerProvider is configured.
func (h *Harvest) tracer() trace.Tracer {
	if h.cfg.TracerProvider == nil {
		return nil
	}
	return h.cfg.TracerProvider.Tracer("github.com/goharvest/goharvest")
}

// Healthy reports whether the harvester is running and its loop is alive: nil, or why not. It
// makes no network calls, so it suits a liveness probe.
func (h *Harvest) Healthy() error {
	if state := h.State(); state != Running {
		return fmt.Errorf("harvest is %v", state)
	}
	// The loop pulses every MinPollInterval, but ending an epoch holds it for up to
	// MaxPollInterval and closing the election longer; two heartbeat timeouts cover both.
	if since := time.Since(time.Unix(0, h.lastPulse.Load())); since > 2*h.cfg.Limits.HeartbeatTimeout {
		return fmt.Errorf("harvest loop has not pulsed for %v", since.Round(time.Millisecond))
	}
	return nil
}

// Pinger is implemented by bindings and electors that can check their connection.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Ready reports whether the harvester is healthy and can reach both Postgres and Kafka: nil, or
// what is wrong. A standby that is ready can take over at once. It suits a readiness probe.
//
// Answering is not enough for a leader: one whose marks, purges or pre-epoch checks keep
// failing (say, behind a pooler that rejects its statements while it answers pings) publishes
// nothing, and Ready says so, with how long, how many failures and the last error. Such a
// leader has no epoch running most of the time, so goharvest_leader reads 0 then too.
func (h *Harvest) Ready(ctx context.Context) error {
	if err := h.Healthy(); err != nil {
		return err
	}
	var errs []error
	if h.elector.State() == neli.Leader {
		for _, e := range []*episode{h.dbTrouble, h.kafkaTrouble} {
			if err := e.outage(); err != nil {
				errs = append(errs, fmt.Errorf("elected leader cannot publish: %w", err))
			}
		}
		h.mu.Lock()
		problem := h.schemaProblem
		h.mu.Unlock()
		if problem != "" {
			errs = append(errs, fmt.Errorf("elected leader cannot publish: the outbox table does not fit: %s", problem))
		}
	}
	if p, ok := h.db.(Pinger); ok {
		if err := p.Ping(ctx); err != nil {
			errs = append(errs, fmt.Errorf("database: %w", err))
		}
	}
	if p, ok := h.elector.(Pinger); ok {
		if err := p.Ping(ctx); err != nil {
			errs = append(errs, fmt.Errorf("kafka: %w", err))
		}
	}
	return errors.Join(errs...)
}

// BacklogSampler is implemented by bindings that can count the outbox's backlog cheaply.
type BacklogSampler interface {
	// Backlog returns how many records the outbox holds (counting stops at limit) and the
	// creation time of the oldest, zero when empty.
	Backlog(ctx context.Context, limit int) (int, time.Time, error)
}

// sampleBacklog keeps the backlog metrics current while this harvester leads.
func (h *Harvest) sampleBacklog() {
	sampler, ok := h.db.(BacklogSampler)
	if !ok {
		return
	}
	tick := time.NewTicker(h.cfg.Limits.BacklogSampleInterval)
	defer tick.Stop()
	for {
		select {
		case <-h.done:
			return
		case <-tick.C:
		}
		if !h.IsLeader() {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), h.cfg.Limits.BacklogSampleInterval)
		n, oldest, err := sampler.Backlog(ctx, backlogLimit)
		cancel()
		if err != nil {
			continue // the database's trouble is counted and logged where it matters
		}
		h.metrics.backlog.Set(float64(n))
		if oldest.IsZero() {
			h.metrics.oldestAge.Set(0)
		} else {
			h.metrics.oldestAge.Set(time.Since(oldest).Seconds())
		}
	}
}

// backlogLimit bounds the count behind goharvest_outbox_backlog_records, so that sampling stays
// cheap however large the backlog grows.
const backlogLimit = 1_000_000

// outageLogInterval is how often an outage that persists is logged again, with its count of
// failures and its latest error, so that a log read at any time shows it is still going on.
const outageLogInterval = 30 * time.Second

// flapWindow is how far back Ready looks for failures that keep coming back: a leader whose
// pre-epoch checks succeed and whose marks then fail ends its outage at each check and starts
// another at the next mark, and publishes nothing all the while.
const flapWindow = 10 * time.Second

// episode follows an outage: it logs when one begins, again every repeat while it persists (if
// repeat is set), and when it ends, however many operations fail in between; and it tells Ready
// whether one is going on.
type episode struct {
	what      string
	meanwhile string             // what goes on during an outage; default "retrying"
	failures  prometheus.Counter // counts every failure; may be nil
	repeat    time.Duration      // zero: log only when an outage begins and ends
	// quiet is how long after its last failure a flapping outage (see flapWindow) still counts
	// for Ready: longer than a retry's backoff.
	quiet time.Duration

	mu       sync.Mutex
	failing  bool
	since    time.Time
	logged   time.Time // when the outage was last logged
	count    int
	lastOp   string
	lastErr  error
	failedAt []time.Time // the failures of the last flapWindow, outages or not
}

func (e *episode) fail(log *slog.Logger, op string, err error, attrs ...any) {
	if e.failures != nil {
		e.failures.Inc()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.count++
	e.lastOp, e.lastErr = op, err
	now := time.Now()
	e.failedAt = append(e.recentFailures(now), now)
	meanwhile := cmp.Or(e.meanwhile, "retrying")
	switch {
	case !e.failing:
		e.failing, e.since, e.logged = true, now, now
		log.Warn(e.what+" unavailable; "+meanwhile, append([]any{"op", op, "error", err}, attrs...)...)
	case e.repeat > 0 && now.Sub(e.logged) >= e.repeat:
		e.logged = now
		log.Warn(e.what+" still unavailable; "+meanwhile, append([]any{"for", now.Sub(e.since).Round(time.Second),
			"failures", e.count, "op", op, "error", err}, attrs...)...)
	}
}

func (e *episode) ok(log *slog.Logger) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failing {
		log.Info(e.what+" available again", "after", time.Since(e.since).Round(time.Millisecond), "failures", e.count)
		e.failing, e.count = false, 0
	}
}

// recentFailures returns the failures of the last flapWindow (e.mu held).
func (e *episode) recentFailures(now time.Time) []time.Time {
	i := 0
	for i < len(e.failedAt) && now.Sub(e.failedAt[i]) > flapWindow {
		i++
	}
	return e.failedAt[i:]
}

// outage describes the outage going on, or returns nil when there is none. One failure, retried
// at once, is not yet an outage; two in a row are, and so are failures that keep coming back
// between successes (three within flapWindow, the last within quiet).
func (e *episode) outage() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	recent := e.recentFailures(now)
	switch {
	case e.failing && e.count >= 2:
		return fmt.Errorf("%s unavailable for %v (%d failures; last: %s: %w)",
			e.what, now.Sub(e.since).Round(time.Millisecond), e.count, e.lastOp, e.lastErr)
	case len(recent) >= 3 && now.Sub(recent[len(recent)-1]) < e.quiet:
		return fmt.Errorf("%s failing again and again (%d failures in the last %v; last: %s: %w)",
			e.what, len(recent), flapWindow, e.lastOp, e.lastErr)
	}
	return nil
}
