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
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/goharvest/goharvest/internal/dispatch"
	"github.com/goharvest/goharvest/internal/outage"
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
	dbTrouble      *outage.Logger
	kafkaTrouble   *outage.Logger
	notifyTrouble  *outage.Logger
	lastPulse      atomic.Int64 // Unix nanoseconds of the owner loop's latest pulse
	failures       *failureMemo // held records' failures, across epochs
	busyEpochs     atomic.Int32 // epochs with a backlog (pipelineDeps.busyEpochs)
	onStandby      atomic.Bool  // the database is a standby: kept out of the election (awaitPrimary)

	// shards are the outbox's shards (one unless Config.Shards > 1), each with its own epochs;
	// the slice is fixed by Start.
	shards []*shard
	// wake is signalled (without blocking) when an epoch start finishes or an epoch asks for a
	// remark, so that the owner loop looks at its shards at once.
	wake chan struct{}

	mu      sync.Mutex // guards the fields below, and each shard's pipeline
	state   State
	handler EventHandler
	events  *dispatch.Dispatcher[Event]
	db      DatabaseBinding
	elector Elector
	// schemaProblem is the last schema mismatch reported by an epoch start, "" when the table fits:
	// the elected leader cannot publish meanwhile, which Ready says.
	schemaProblem string
	err           error // what stopped the harvester

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
		"transactional.id":    TransactionalID(cfg.LeaderGroupID, 0, cfg.Shards),
	})
	h := &Harvest{
		cfg:            cfg,
		producerConfig: producerConfig,
		log:            cfg.Logger.With("harvest", cfg.Name),
		state:          Created,
		stopCh:         make(chan struct{}),
		done:           make(chan struct{}),
		failures:       &failureMemo{},
		wake:           make(chan struct{}, 1),
	}
	h.metrics = newMetrics(cfg.Name, h.inFlight, h.heldStats)
	h.metrics.shards = newShardCollector(cfg.Name, h)
	quiet := 3*cfg.Limits.IOErrorBackoff + time.Second
	h.dbTrouble = &outage.Logger{What: "database",
		Failures: h.metrics.errors.WithLabelValues(errorKindDatabase), Repeat: outage.LogInterval, Quiet: quiet}
	h.kafkaTrouble = &outage.Logger{What: "Kafka transactions",
		Failures: h.metrics.errors.WithLabelValues(errorKindKafka), Repeat: outage.LogInterval, Quiet: quiet}
	// Notifications only speed things up: their loss is said once, not repeated.
	h.notifyTrouble = &outage.Logger{What: "notifications of new records", Meanwhile: "polling instead"}
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
	shards, err := h.newShards(db)
	if err != nil {
		db.Dispose()
		h.metrics.unregister(h.cfg.MetricsRegisterer)
		return err
	}
	elector, err := h.cfg.NeliProvider(neli.Config{
		KafkaConfig:      h.cfg.BaseKafkaConfig,
		LeaderTopic:      h.cfg.LeaderTopic,
		LeaderGroupID:    h.cfg.LeaderGroupID,
		Partitions:       h.cfg.Shards,
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
	h.db, h.elector, h.shards = db, elector, shards
	h.events = dispatch.New(h.handler)
	h.meter = metric.NewMeter("throughput", h.cfg.Limits.MinMetricsInterval)
	h.state = Running
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

// IsLeader reports whether this harvester is publishing now (any shard, with Config.Shards > 1).
func (h *Harvest) IsLeader() bool { return h.LeaderID() != nil }

// LeaderID returns the ID under which this harvester is marking records, or nil when it is not
// the leader. It changes on every remark. With Config.Shards > 1 it is that of the lowest shard
// this harvester leads; LeadShards gives them all.
func (h *Harvest) LeaderID() *uuid.UUID {
	if ps := h.epochs(); len(ps) > 0 {
		id := ps[0].leaderID
		return &id
	}
	return nil
}

// LeadShards returns the shards this harvester is publishing now, in order, with the leader ID
// of each (see Config.Shards; with one shard, shard 0 while this harvester leads).
func (h *Harvest) LeadShards() map[int]uuid.UUID {
	h.mu.Lock()
	defer h.mu.Unlock()
	led := map[int]uuid.UUID{}
	for _, s := range h.shards {
		if s.pipeline != nil {
			led[s.id] = s.pipeline.leaderID
		}
	}
	return led
}

// ShardCount returns how many shards the outbox has (Config.Shards, after defaults).
func (h *Harvest) ShardCount() int { return h.cfg.Shards }

// epochs returns the epochs running now, in shard order.
func (h *Harvest) epochs() []*pipeline {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ps []*pipeline
	for _, s := range h.shards {
		if s.pipeline != nil {
			ps = append(ps, s.pipeline)
		}
	}
	return ps
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
	var (
		keys []string
		n    int
	)
	// A key belongs to one shard, so the shards' keys never repeat one another.
	for _, p := range h.epochs() {
		k, m := p.inFlight()
		keys, n = append(keys, k...), n+m
	}
	return keys, n
}

func (h *Harvest) emit(e Event) { h.events.Emit(e) }

// TransactionalID is the transactional ID of a shard's producers, which every harvester of the
// outbox shares for that shard: goharvest.<group>, or goharvest.<group>.<shard> when the outbox
// has more than one shard. Kafka lets one producer at a time use it, which is what fences an
// earlier leader of the shard.
func TransactionalID(leaderGroupID string, shard, shards int) string {
	if shards <= 1 {
		return TransactionalIDPrefix + leaderGroupID
	}
	return TransactionalIDPrefix + leaderGroupID + "." + strconv.Itoa(shard)
}

// shard is one shard of the outbox and the epochs of this harvester that publish it: an epoch
// runs while this harvester leads the shard's partition of the leader topic.
type shard struct {
	id             int
	db             DatabaseBinding // marks only this shard's rows
	producerConfig KafkaConfigMap  // with the shard's transactional ID

	// pipeline is the current epoch, nil while this harvester does not publish the shard. Set by
	// the owner goroutine, guarded by Harvest.mu, so that other goroutines may read it.
	pipeline *pipeline

	// Owned by the owner goroutine (run):
	starting    *epochStart     // an epoch being prepared, if any
	prevClosed  <-chan struct{} // closed once the last epoch's producer has closed
	unpurged    []int64         // records the last epoch published and could not purge
	acquired    bool            // the current leadership of the shard has had an epoch already
	nextEpochAt time.Time       // after an error, the next epoch waits for IOErrorBackoff

	backlog atomic.Int64 // the shard's latest backlog sample, -1 when none; written by sampleBacklog
}

// newShards makes the shards of the outbox, with a view of the binding for each.
func (h *Harvest) newShards(db DatabaseBinding) ([]*shard, error) {
	sharder, ok := db.(Sharder)
	if h.cfg.Shards > 1 && !ok {
		return nil, fmt.Errorf("harvest: Shards is %d, but the database binding (%T) cannot mark by shard", h.cfg.Shards, db)
	}
	closed := make(chan struct{})
	close(closed)
	shards := make([]*shard, h.cfg.Shards)
	for i := range shards {
		s := &shard{id: i, db: db, producerConfig: h.producerConfig, prevClosed: closed}
		s.backlog.Store(-1)
		if h.cfg.Shards > 1 {
			s.db = sharder.Shard(i, h.cfg.Shards)
			s.producerConfig = maps.Clone(h.producerConfig)
			s.producerConfig["transactional.id"] = TransactionalID(h.cfg.LeaderGroupID, i, h.cfg.Shards)
		}
		shards[i] = s
	}
	return shards, nil
}

// signal wakes the owner loop, without waiting: one pending wake-up serves any number of reasons,
// since the loop looks at every shard each time.
func (h *Harvest) signal() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// run is the owner loop: it pulses the election and starts and ends each shard's epochs. Every
// epoch change happens on this goroutine (leadershipLost runs inside Pulse), so a shard's epochs
// never overlap. Starting an epoch talks to the database and to Kafka, which may be slow; it runs
// on a goroutine of its own (see epochStart) while this loop keeps pulsing, so that the group
// never waits on it.
func (h *Harvest) run() {
	defer close(h.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ticker := time.NewTicker(h.cfg.Limits.MinPollInterval)
	defer ticker.Stop()

	if !h.awaitPrimary() {
		h.shutdown(nil)
		return
	}
	var err error
loop:
	for {
		h.lastPulse.Store(time.Now().UnixNano())
		if _, err = h.elector.Pulse(ctx); err != nil {
			break
		}
		if err = h.tend(ctx); err != nil {
			break
		}
		select {
		case <-h.stopCh:
			break loop
		case <-h.wake:
		case <-ticker.C:
		}
	}
	h.shutdown(err)
}

// tend brings every shard in line with the election: it ends the epochs of shards no longer led
// (the clock fenced us between pulses; neli's barrier follows when it notices), finishes the
// starts that are done, ends the epochs that asked for a remark, and begins epochs for the shards
// led that have none. It returns an error that stops the harvester.
func (h *Harvest) tend(ctx context.Context) error {
	led := h.elector.Partitions()
	var lost []*shard
	for _, s := range h.shards {
		if !slices.Contains(led, int32(s.id)) {
			lost = append(lost, s)
		}
	}
	h.endShards(lost, func(s *shard) Event { return h.lossEvent(s.id) })
	for _, s := range h.shards {
		if p := h.epochOf(s); p != nil {
			select {
			case <-p.remark():
				h.endEpoch(s, nil)
				if p.remarkErr.Load() {
					s.nextEpochAt = time.Now().Add(h.cfg.Limits.IOErrorBackoff)
				}
			default:
			}
		}
		if st := s.starting; st != nil {
			select {
			case <-st.done:
			default:
				continue
			}
			s.starting = nil
			switch {
			case st.err != nil:
				return st.err
			case st.producer == nil:
				s.nextEpochAt = time.Now().Add(h.cfg.Limits.IOErrorBackoff)
			case h.stopping() || !slices.Contains(led, int32(s.id)):
				// Stop was called, or the clock fenced us, while the start ran.
				st.producer.Close()
			default:
				h.launchEpoch(s, st.producer)
				s.acquired = true
			}
		}
		if slices.Contains(led, int32(s.id)) && h.epochOf(s) == nil && s.starting == nil &&
			!time.Now().Before(s.nextEpochAt) && !h.stopping() {
			s.starting = h.beginEpoch(ctx, s)
		}
	}
	return nil
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

// current returns the epoch of the lowest shard this harvester publishes, nil if none.
func (h *Harvest) current() *pipeline {
	if ps := h.epochs(); len(ps) > 0 {
		return ps[0]
	}
	return nil
}

func (h *Harvest) epochOf(s *shard) *pipeline {
	h.mu.Lock()
	defer h.mu.Unlock()
	return s.pipeline
}

// epochStart is an epoch being prepared on a goroutine of its own: the schema check, a new
// producer whose InitTransactions fences the producers of every earlier epoch of the shard, and
// the purge of records earlier epochs published and did not purge. It belongs to the owner
// goroutine.
type epochStart struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the fields below are set
	// producer is ready to publish; nil when a step failed and the start is to be retried.
	producer KafkaProducer
	// err is a failure that retrying cannot cure (Kafka refusing the harvester's settings); it
	// stops the harvester.
	err error
}

// beginEpoch starts preparing an epoch of a shard. Every step that cannot be cancelled
// (librdkafka's InitTransactions honours only a deadline) is bounded by MaxPollInterval, so that
// abandonStart, which a handover waits for, returns within that bound.
func (h *Harvest) beginEpoch(ctx context.Context, s *shard) *epochStart {
	ctx, cancel := context.WithCancel(ctx)
	st := &epochStart{cancel: cancel, done: make(chan struct{})}
	prevClosed, unpurged := s.prevClosed, s.unpurged
	go func() {
		defer h.signal()
		defer close(st.done)
		// The previous epoch's producer closes in the background; the next one waits for it, so
		// that one process never has two for a shard.
		select {
		case <-prevClosed:
		case <-ctx.Done():
			return
		}
		st.producer, st.err = h.prepareEpoch(ctx, s, unpurged)
	}()
	return st
}

// prepareEpoch runs the steps of an epoch's start and returns its producer, or nil when a step
// failed and should be retried after IOErrorBackoff.
func (h *Harvest) prepareEpoch(ctx context.Context, s *shard, unpurged []int64) (KafkaProducer, error) {
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
		h.log.Info("purged records the last epoch published and could not purge", "records", len(unpurged), "shard", s.id)
	}
	if ctx.Err() != nil {
		return nil, nil
	}
	producer, err := h.cfg.KafkaProducerProvider(s.producerConfig)
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
		if h.cfg.Shards > 1 {
			// Each shard has a transactional ID of its own; one ACL can cover them all.
			return nil, fmt.Errorf("harvest: Kafka refuses the producer's settings or permissions (a PREFIXED ACL on TransactionalId %s. covers every shard's): %w",
				TransactionalID(h.cfg.LeaderGroupID, 0, 1), err)
		}
		return nil, fmt.Errorf("harvest: Kafka refuses the producer's settings or permissions: %w", err)
	}
	if err != nil {
		if ctx.Err() == nil {
			h.kafkaTrouble.Fail(h.log, "init transactions", err, "shard", s.id)
		}
		producer.Close()
		return nil, nil
	}
	if ctx.Err() != nil {
		producer.Close()
		return nil, nil
	}
	if ok, err := h.purgeNoted(ctx, s, producer); !ok {
		producer.Close()
		return nil, err
	}
	// Only a start that got through every step ends an outage: a step that succeeds while a later
	// one keeps failing would otherwise end it and begin it again on every attempt, and the
	// outage would never count as lasting (for the log and for Ready).
	h.dbTrouble.OK(h.log)
	h.kafkaTrouble.OK(h.log)
	return producer, nil
}

// abandonStart cancels a shard's epoch start under way and waits for it, closing its producer if
// it got one. It returns within about MaxPollInterval (see beginEpoch).
func (h *Harvest) abandonStart(s *shard) {
	st := s.starting
	if st == nil {
		return
	}
	s.starting = nil
	st.cancel()
	<-st.done
	if st.producer != nil {
		st.producer.Close()
	}
}

// launchEpoch begins publishing a shard under a new leader ID through a prepared producer.
func (h *Harvest) launchEpoch(s *shard, producer KafkaProducer) {
	s.unpurged = nil
	leaderID := uuid.New()
	p := startPipeline(pipelineDeps{
		leaderID:   leaderID,
		limits:     h.cfg.Limits,
		db:         s.db,
		producer:   producer,
		log:        h.log.With("shard", s.id),
		emit:       h.emit,
		meter:      h.meter,
		dbTrouble:  h.dbTrouble,
		notify:     h.notifyTrouble,
		metrics:    h.metrics,
		tracer:     h.tracer(),
		leading:    func() bool { return slices.Contains(h.elector.Partitions(), int32(s.id)) },
		notes:      h.notePlace(s.id),
		idHeader:   h.cfg.IDHeader,
		failures:   h.failures,
		onRemark:   h.signal,
		busyEpochs: &h.busyEpochs,
	})
	h.mu.Lock()
	s.pipeline = p
	h.mu.Unlock()
	h.metrics.leader.Set(float64(len(h.epochs())))
	if s.acquired {
		h.metrics.remarks.Inc()
		h.log.Info("leader refreshed", "leaderID", leaderID, "shard", s.id)
		h.emit(LeaderRefreshed{Shard: s.id, LeaderID: leaderID})
	} else {
		h.metrics.elections.Inc()
		h.log.Info("leader acquired", "leaderID", leaderID, "shard", s.id)
		h.emit(LeaderAcquired{Shard: s.id, LeaderID: leaderID})
	}
}

// notePlace is where a shard's transactions leave their notes (see note.go).
func (h *Harvest) notePlace(shard int) NotePlace {
	return NotePlace{Group: h.cfg.LeaderGroupID + NoteGroupSuffix, Topic: h.cfg.LeaderTopic, Partition: int32(shard)}
}

// purgeNoted purges the records that the shard's latest committed note lists: an earlier epoch
// published them and may have stopped before purging them. InitTransactions has settled every
// earlier transaction of the shard, so the note read is final. It reports false, to be retried,
// when Kafka or the database fails, with an error when Kafka refuses to let it read the note
// (a KafkaConfigError: retrying cannot help).
func (h *Harvest) purgeNoted(ctx context.Context, s *shard, producer KafkaProducer) (bool, error) {
	place := h.notePlace(s.id)
	readCtx, cancel := context.WithTimeout(ctx, h.cfg.Limits.MaxPollInterval)
	note, err := producer.ReadNote(readCtx, place)
	cancel()
	var refused *KafkaConfigError
	if errors.As(err, &refused) {
		return false, fmt.Errorf("harvest: Kafka refuses the permissions the note needs: %w", err)
	}
	if err != nil {
		if ctx.Err() == nil {
			h.kafkaTrouble.Fail(h.log, "read note", err, "shard", s.id)
		}
		return false, nil
	}
	ids, err := decodeNote(note)
	if err != nil {
		// Not ours to interpret: someone else wrote to the group. Publishing on would risk a run
		// going out again whole, so wait for an operator.
		h.kafkaTrouble.Fail(h.log, "read note of group "+place.Group, err, "shard", s.id)
		return false, nil
	}
	if len(ids) == 0 {
		return true, nil
	}
	return h.purgeIDs(ctx, "purge noted records", ids), nil
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
				h.dbTrouble.Fail(h.log, op, err)
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
			h.dbTrouble.Fail(h.log, "check schema", err)
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

// endEpoch drains and closes a shard's epoch, within about MaxPollInterval, then reports why it
// ended (nil for a remark, which LeaderRefreshed reports when the next epoch starts).
func (h *Harvest) endEpoch(s *shard, why Event) {
	if p := h.epochOf(s); p != nil {
		unpurged, closed := p.stop(h.cfg.Limits.MaxPollInterval)
		s.unpurged = append(s.unpurged, unpurged...)
		s.prevClosed = closed
		h.mu.Lock()
		s.pipeline = nil
		h.mu.Unlock()
		h.metrics.leader.Set(float64(len(h.epochs())))
	} else if !s.acquired {
		return // no epoch of this leadership has run: no leadership to report lost
	}
	if _, fenced := why.(LeaderFenced); fenced {
		h.metrics.fences.Inc()
	}
	if why != nil {
		h.log.Info(why.String(), "shard", s.id)
		h.emit(why)
	}
}

// endShards ends this harvester's leadership of the shards given: it abandons their starts and
// ends their epochs, all at once, so that losing many shards takes no longer than losing one
// (about MaxPollInterval), and reports the loss of each shard that had an epoch in this
// leadership, even if it is between two epochs (after a remark) just now.
func (h *Harvest) endShards(shards []*shard, why func(*shard) Event) {
	var wg sync.WaitGroup
	for _, s := range shards {
		if s.starting == nil && h.epochOf(s) == nil && !s.acquired {
			continue
		}
		wg.Go(func() {
			h.abandonStart(s)
			h.endEpoch(s, why(s))
		})
	}
	wg.Wait()
	for _, s := range shards {
		s.acquired = false
	}
}

// leadershipLost is neli's Barrier: it runs on the owner goroutine, inside Pulse, when shards
// are revoked or fenced, and the handover waits for it.
func (h *Harvest) leadershipLost(partitions []int32) {
	var lost []*shard
	for _, s := range h.shards {
		if slices.Contains(partitions, int32(s.id)) {
			lost = append(lost, s)
		}
	}
	h.endShards(lost, func(s *shard) Event { return h.lossEvent(s.id) })
}

// lossEvent says how leadership of a shard was lost.
func (h *Harvest) lossEvent(shard int) Event {
	if h.elector.State() == neli.Fenced {
		return LeaderFenced{Shard: shard}
	}
	return LeaderRevoked{Shard: shard}
}

// shutdown ends the epochs, leaves the election and releases everything.
func (h *Harvest) shutdown(cause error) {
	h.mu.Lock()
	h.state = Stopping
	h.mu.Unlock()
	h.log.Info("stopping", "error", cause)
	h.endShards(h.shards, func(s *shard) Event { return LeaderRevoked{Shard: s.id} })
	closeCtx, cancel := context.WithTimeout(context.Background(), 2*h.cfg.Limits.HeartbeatTimeout)
	defer cancel()
	if err := h.elector.Close(closeCtx); err != nil {
		h.log.Warn("leave the leader election", "error", err)
	}
	for _, s := range h.shards {
		select {
		case <-s.prevClosed:
		case <-closeCtx.Done():
			h.log.Warn("the last epoch's producer is still closing at shutdown", "shard", s.id)
		}
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
		for _, e := range []*outage.Logger{h.dbTrouble, h.kafkaTrouble} {
			if err := e.Err(); err != nil {
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
	if h.onStandby.Load() {
		errs = append(errs, fmt.Errorf("database: %w; not joining the leader election until it does", ErrStandby))
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

// sampleBacklog keeps the backlog metrics current while this harvester leads: the whole outbox's,
// and with Config.Shards > 1 each led shard's.
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
		led := h.LeadShards()
		if len(led) == 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), h.cfg.Limits.BacklogSampleInterval)
		n, oldest, err := sampler.Backlog(ctx, backlogLimit)
		if err == nil { // else the database's trouble is counted and logged where it matters
			h.metrics.backlog.Set(float64(n))
			if oldest.IsZero() {
				h.metrics.oldestAge.Set(0)
			} else {
				h.metrics.oldestAge.Set(time.Since(oldest).Seconds())
			}
		}
		for _, s := range h.shards {
			if _, leads := led[s.id]; !leads {
				s.backlog.Store(-1)
				continue
			}
			n, err := n, err // one shard is the whole outbox, sampled above
			if h.cfg.Shards > 1 {
				n, _, err = s.db.(BacklogSampler).Backlog(ctx, backlogLimit) // a view of the same binding
			}
			if err == nil {
				s.backlog.Store(int64(n))
			}
		}
		cancel()
	}
}

// backlogLimit bounds the count behind goharvest_outbox_backlog_records, so that sampling stays
// cheap however large the backlog grows.
const backlogLimit = 1_000_000
