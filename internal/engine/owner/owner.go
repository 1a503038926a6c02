// Package owner runs a harvester: it pulses the leader election and, for each shard this
// harvester leads, starts an epoch (package epoch) and ends it when leadership ends, the epoch
// asks for a remark, or the harvester stops. Every epoch change happens on one goroutine, the
// owner loop, so a shard's epochs never overlap. The root package's Harvest is an Owner with
// the drivers (Postgres, confluent-kafka-go, neli) plugged in; this package imports none of them.
package owner

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/dispatch"
	"github.com/goharvest/goharvest/internal/engine/epoch"
	"github.com/goharvest/goharvest/internal/outage"
	"github.com/goharvest/goharvest/metric"
)

// Claim is how an epoch claims the rows it publishes.
type Claim int

const (
	// ClaimByReading reads rows without writing to them (epoch.ReadClaim); the store must be a
	// driver.Reader, or Start fails.
	ClaimByReading Claim = iota
	// ClaimByMarking sets each row's leader_id before publishing it (epoch.MarkClaim).
	ClaimByMarking
)

func (c Claim) String() string {
	switch c {
	case ClaimByReading:
		return "read"
	case ClaimByMarking:
		return "mark"
	}
	return "Claim(" + strconv.Itoa(int(c)) + ")"
}

// Config is what an Owner needs, after the root package has applied defaults and validated.
type Config struct {
	// Name labels the metrics and logs (goharvest.Config.Name).
	Name string
	// Shards is how many shards the outbox has.
	Shards int
	Limits epoch.Limits
	Logger *slog.Logger
	// Registerer takes the metrics.
	Registerer prometheus.Registerer
	// Tracer records a span per published record; nil when tracing is off.
	Tracer trace.Tracer
	// IDHeader names the header that carries each record's id; "" for none.
	IDHeader string
	// Claim is how epochs claim rows (goharvest.Config.ClaimStrategy).
	Claim Claim
	// NoteGroup and LeaderTopic make each shard's NotePlace (the shard is the partition).
	NoteGroup, LeaderTopic string
	// TransactionalID is the shards' transactional ID without a shard suffix, for error messages.
	TransactionalID string

	// OpenStore opens the outbox, once, at Start, which disposes of it if it fails. The binding
	// must be a driver.Store.
	OpenStore func() (driver.DatabaseBinding, error)
	// NewElector joins the leader election; lost is its barrier, called inside Pulse when shards
	// are revoked or fenced.
	NewElector func(lost func(partitions []int32)) (driver.Elector, error)
	// NewProducer creates a shard's producer, with the shard's transactional ID; it contacts no
	// broker. Start creates and closes one for shard 0 to check the settings.
	NewProducer func(shard int) (driver.KafkaProducer, error)
}

// New returns an owner ready to start. It does not connect to anything.
func New(cfg Config) *Owner {
	h := &Owner{
		cfg:      cfg,
		log:      cfg.Logger.With("harvest", cfg.Name),
		state:    Created,
		stopCh:   make(chan struct{}),
		done:     make(chan struct{}),
		failures: &epoch.Failures{},
		wake:     make(chan struct{}, 1),
	}
	h.metrics = epoch.NewMetrics(cfg.Name, h.inFlight, h.heldStats)
	h.metrics.Shards = newShardCollector(cfg.Name, h)
	quiet := 3*cfg.Limits.IOErrorBackoff + time.Second
	h.dbTrouble = &outage.Logger{What: "database",
		Failures: h.metrics.Errors.WithLabelValues(epoch.ErrorKindDatabase), Repeat: outage.LogInterval, Quiet: quiet}
	h.kafkaTrouble = &outage.Logger{What: "Kafka transactions",
		Failures: h.metrics.Errors.WithLabelValues(epoch.ErrorKindKafka), Repeat: outage.LogInterval, Quiet: quiet}
	// Notifications only speed things up: their loss is said once, not repeated.
	h.notifyTrouble = &outage.Logger{What: "notifications of new records", Meanwhile: "polling instead"}
	return h
}

// State is an Owner's (and so a Harvest's) place in its lifecycle.
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
	switch s {
	case Created:
		return "created"
	case Running:
		return "running"
	case Stopping:
		return "stopping"
	case Stopped:
		return "stopped"
	}
	return "State(" + strconv.Itoa(int(s)) + ")"
}

// Owner runs a harvester: the owner loop that pulses the election and starts and ends each
// shard's epochs. Create it with New, then Start it, and later Stop and Await it. It runs once.
type Owner struct {
	cfg           Config
	log           *slog.Logger
	meter         *metric.Meter
	metrics       *epoch.Metrics
	dbTrouble     *outage.Logger
	kafkaTrouble  *outage.Logger
	notifyTrouble *outage.Logger
	lastPulse     atomic.Int64    // Unix nanoseconds of the owner loop's latest pulse
	failures      *epoch.Failures // held records' failures, across epochs
	busyEpochs    atomic.Int32    // epochs with a backlog (epoch.Deps.BusyEpochs)
	onStandby     atomic.Bool     // the database is a standby: kept out of the election (awaitPrimary)

	// shards are the outbox's shards (one unless Config.Shards > 1), each with its own epochs;
	// the slice is fixed by Start.
	shards []*shard
	// wake is signalled (without blocking) when an epoch start finishes or an epoch asks for a
	// remark, so that the owner loop looks at its shards at once.
	wake chan struct{}

	mu      sync.Mutex // guards the fields below, and each shard's epoch
	state   State
	handler func(event.Event)
	events  *dispatch.Dispatcher[event.Event]
	db      driver.Store
	elector driver.Elector
	// features are db's, and electorPing the elector's Ping if it has one: found once, by Start.
	features    driver.Features
	electorPing driver.Pinger
	// schemaProblem is the last schema mismatch reported by an epoch start, "" when the table fits:
	// the elected leader cannot publish meanwhile, which Ready says.
	schemaProblem string
	err           error // what stopped the harvester

	stopOnce sync.Once
	stopCh   chan struct{}
	done     chan struct{}
}

// SetEventHandler registers the handler for events (see event.Event); call it before Start.
func (h *Owner) SetEventHandler(handler func(event.Event)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handler = handler
}

// Start opens the outbox and joins the leader election, then returns; the work goes on in the
// background until Stop. It fails if the harvester was started before or cannot be set up.
func (h *Owner) Start() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != Created {
		return fmt.Errorf("harvest: cannot start in state %v", h.state)
	}
	binding, err := h.cfg.OpenStore()
	if err != nil {
		return fmt.Errorf("harvest: open outbox: %w", err)
	}
	if err := h.metrics.Register(h.cfg.Registerer); err != nil {
		h.metrics.Unregister(h.cfg.Registerer)
		binding.Dispose()
		return fmt.Errorf("harvest: register metrics (is another harvester named %q registered?): %w", h.cfg.Name, err)
	}
	db, err := driver.AsStore(binding)
	if err != nil {
		binding.Dispose()
		h.metrics.Unregister(h.cfg.Registerer)
		return fmt.Errorf("harvest: open outbox: %w", err)
	}
	shards, err := h.newShards(db)
	if err == nil && h.cfg.Claim == ClaimByReading && driver.FeaturesOf(db).Read == nil {
		err = fmt.Errorf("harvest: claimStrategy is read, but the database binding (%T) cannot read rows without marking them (driver.Reader); set claimStrategy: mark", db)
	}
	if err != nil {
		db.Dispose()
		h.metrics.Unregister(h.cfg.Registerer)
		return err
	}
	elector, err := h.cfg.NewElector(h.leadershipLost)
	if err != nil {
		db.Dispose()
		h.metrics.Unregister(h.cfg.Registerer)
		return fmt.Errorf("harvest: leader election: %w", err)
	}
	// Every instance checks the producer's settings now, rather than only the one elected, and
	// only when it is: creating a producer contacts no broker, so a failure is a bad setting.
	probe, err := h.cfg.NewProducer(0)
	if err != nil {
		elector.Close(context.Background())
		db.Dispose()
		h.metrics.Unregister(h.cfg.Registerer)
		return fmt.Errorf("harvest: producer config: %w", err)
	}
	probe.Close()
	h.features = driver.FeaturesOf(db)
	h.electorPing, _ = elector.(driver.Pinger)
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
func (h *Owner) Stop() {
	h.stopOnce.Do(func() { close(h.stopCh) })
}

// Await blocks until the harvester has stopped, and returns the error that stopped it, if
// any. It returns at once for a harvester that was never started.
func (h *Owner) Await() error {
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
func (h *Owner) Run(ctx context.Context) error {
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
func (h *Owner) State() State {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state
}

// IsLeader reports whether this harvester is publishing now (any shard, with Config.Shards > 1).
func (h *Owner) IsLeader() bool { return h.LeaderID() != nil }

// LeaderID returns the ID under which this harvester is marking records, or nil when it is not
// the leader. It changes on every remark. With Config.Shards > 1 it is that of the lowest shard
// this harvester leads; LeadShards gives them all.
func (h *Owner) LeaderID() *uuid.UUID {
	if ps := h.epochs(); len(ps) > 0 {
		id := ps[0].LeaderID
		return &id
	}
	return nil
}

// LeadShards returns the shards this harvester is publishing now, in order, with the leader ID
// of each (see Config.Shards; with one shard, shard 0 while this harvester leads).
func (h *Owner) LeadShards() map[int]uuid.UUID {
	h.mu.Lock()
	defer h.mu.Unlock()
	led := map[int]uuid.UUID{}
	for _, s := range h.shards {
		if s.epoch != nil {
			led[s.id] = s.epoch.LeaderID
		}
	}
	return led
}

// ShardCount returns how many shards the outbox has (Config.Shards, after defaults).
func (h *Owner) ShardCount() int { return h.cfg.Shards }

// epochs returns the epochs running now, in shard order.
func (h *Owner) epochs() []*epoch.Epoch {
	h.mu.Lock()
	defer h.mu.Unlock()
	var ps []*epoch.Epoch
	for _, s := range h.shards {
		if s.epoch != nil {
			ps = append(ps, s.epoch)
		}
	}
	return ps
}

// InFlightRecords returns how many records are in flight: marked and not yet purged, except the
// records of held keys (see HeldRecords) from the held one on, unless it is being sent again. It
// is the count that Limits.MaxInFlightRecords bounds (see there for how held keys can pass it).
func (h *Owner) InFlightRecords() int {
	_, n := h.inFlight()
	return n
}

// InFlightRecordKeys returns the keys of the records counted by InFlightRecords, each once.
func (h *Owner) InFlightRecordKeys() []string {
	keys, _ := h.inFlight()
	return keys
}

func (h *Owner) inFlight() ([]string, int) {
	var (
		keys []string
		n    int
	)
	// A key belongs to one shard, so the shards' keys never repeat one another.
	for _, p := range h.epochs() {
		k, m := p.InFlight()
		keys, n = append(keys, k...), n+m
	}
	return keys, n
}

func (h *Owner) emit(e event.Event) { h.events.Emit(e) }

// run is the owner loop: it pulses the election and starts and ends each shard's epochs. Every
// epoch change happens on this goroutine (leadershipLost runs inside Pulse), so a shard's epochs
// never overlap. Starting an epoch talks to the database and to Kafka, which may be slow; it runs
// on a goroutine of its own (see epochStart) while this loop keeps pulsing, so that the group
// never waits on it.
//
// It pulses every MinPollInterval, or, at rest (see atRest) with an election that can say how
// long it may wait (driver.RestingElector), when the election asks, within maxRestFraction: an
// idle outbox's loop then wakes once a heartbeat timeout's tenth, when its heartbeat is due,
// rather than ten times a second.
func (h *Owner) run() {
	defer close(h.done)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resting, _ := h.elector.(driver.RestingElector)
	var electorWake <-chan struct{} // nil, never ready, unless the election can rest
	if resting != nil {
		electorWake = resting.Wake()
	}
	timer := time.NewTimer(h.cfg.Limits.MinPollInterval)
	defer timer.Stop()

	if !h.awaitPrimary() {
		h.shutdown(nil)
		return
	}
	var err error
loop:
	for {
		began := time.Now()
		h.lastPulse.Store(began.UnixNano())
		if _, err = h.elector.Pulse(ctx); err != nil {
			break
		}
		if err = h.tend(ctx); err != nil {
			break
		}
		next := began.Add(h.cfg.Limits.MinPollInterval)
		if resting != nil && h.atRest() {
			// A rest counts from when the election says it: it names the moment its next
			// heartbeat is due, and a loop woken a Pulse's length early would find nothing to do
			// and pulse again only a MinPollInterval later, late for it.
			rest := min(resting.Rest(), h.cfg.Limits.HeartbeatTimeout/maxRestFraction)
			if after := time.Now().Add(rest); after.After(next) {
				next = after
			}
		}
		timer.Reset(time.Until(next))
		select {
		case <-h.stopCh:
			break loop
		case <-h.wake:
		case <-electorWake:
		case <-timer.C:
		}
	}
	h.shutdown(err)
}

// maxRestFraction bounds the owner loop's rest to a quarter of the heartbeat timeout, whatever the
// election asks: an election that errs in its Rest then costs a late pulse, not a loop that
// Healthy (two heartbeat timeouts without a pulse) calls stuck.
const maxRestFraction = 4

// atRest reports whether the owner loop has nothing to do until the election changes: every
// shard led has its epoch running, and no shard is starting one, waiting to start one again, or
// running one it no longer leads. An epoch's end, and a start's, wake the loop (see signal).
func (h *Owner) atRest() bool {
	led := h.elector.Partitions()
	for _, s := range h.shards {
		if s.starting != nil || (h.epochOf(s) != nil) != slices.Contains(led, int32(s.id)) {
			return false
		}
	}
	return true
}

// tend brings every shard in line with the election: it ends the epochs of shards no longer led
// (the clock fenced us between pulses; neli's barrier follows when it notices), finishes the
// starts that are done, ends the epochs that asked for a remark, and begins epochs for the shards
// led that have none. It returns an error that stops the harvester.
func (h *Owner) tend(ctx context.Context) error {
	led := h.elector.Partitions()
	var lost []*shard
	for _, s := range h.shards {
		if !slices.Contains(led, int32(s.id)) {
			lost = append(lost, s)
		}
	}
	h.endShards(lost, func(s *shard) event.Event { return h.lossEvent(s.id) })
	for _, s := range h.shards {
		if p := h.epochOf(s); p != nil {
			select {
			case <-p.Remark():
				h.endEpoch(s, nil)
				if p.RemarkedOnError() {
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
func (h *Owner) stopping() bool {
	select {
	case <-h.stopCh:
		return true
	default:
		return false
	}
}

// current returns the epoch of the lowest shard this harvester publishes, nil if none.
func (h *Owner) current() *epoch.Epoch {
	if ps := h.epochs(); len(ps) > 0 {
		return ps[0]
	}
	return nil
}

func (h *Owner) epochOf(s *shard) *epoch.Epoch {
	h.mu.Lock()
	defer h.mu.Unlock()
	return s.epoch
}

// shutdown ends the epochs, leaves the election and releases everything.
func (h *Owner) shutdown(cause error) {
	h.mu.Lock()
	h.state = Stopping
	h.mu.Unlock()
	h.log.Info("stopping", "error", cause)
	h.endShards(h.shards, func(s *shard) event.Event { return event.LeaderRevoked{Shard: s.id} })
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
	// Closing the database's connections can take long on a server that does not answer: pgx
	// cancels a query that timed out over a connection of its own and waits up to 15 s for the
	// server, and closing the pool waits for that. Stop does not.
	disposed := make(chan struct{})
	go func() {
		defer close(disposed)
		h.db.Dispose()
	}()
	select {
	case <-disposed:
	case <-closeCtx.Done():
		h.log.Warn("the database's connections are still closing at shutdown (a server that does not answer?); they close in the background")
	}
	h.metrics.Unregister(h.cfg.Registerer)
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

// HeldRecords returns the records that hold back their keys now, oldest first; empty when this
// harvester does not lead.
func (h *Owner) HeldRecords() []event.HeldRecord {
	list := []event.HeldRecord{}
	for _, p := range h.epochs() {
		list = append(list, p.Held()...)
	}
	slices.SortStableFunc(list, func(a, b event.HeldRecord) int { return a.Since.Compare(b.Since) })
	return list
}

// heldStats returns how many records are held and when the oldest first failed.
func (h *Owner) heldStats() (int, time.Time) {
	list := h.HeldRecords()
	if len(list) == 0 {
		return 0, time.Time{}
	}
	return len(list), list[0].Since
}
