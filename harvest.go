package goharvest

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/owner"
)

// TransactionalIDPrefix is put before LeaderGroupID to make the producers' transactional ID,
// which every harvester of an outbox shares (see TransactionalID).
const TransactionalIDPrefix = owner.TransactionalIDPrefix

// TransactionalID is the transactional ID of a shard's producers, which every harvester of the
// outbox shares for that shard: goharvest.<group>, or goharvest.<group>.<shard> when the outbox
// has more than one shard. Kafka lets one producer at a time use it, which is what fences an
// earlier leader of the shard. The reaper's ACLs name it (docs/operations.md).
func TransactionalID(leaderGroupID string, shard, shards int) string {
	return owner.TransactionalID(leaderGroupID, shard, shards)
}

// NoteGroupSuffix is put after LeaderGroupID to make the consumer group in which transactions
// leave their notes (see NotePlace). The producer's principal needs Read on this group.
const NoteGroupSuffix = ".notes"

// State is a Harvest's place in its lifecycle: Created, Running, Stopping, then Stopped.
type State = owner.State

// The states of a Harvest.
const (
	// Created: configured, not started.
	Created = owner.Created
	// Running: started.
	Running = owner.Running
	// Stopping: Stop was called (or a fatal error happened); work is winding down.
	Stopping = owner.Stopping
	// Stopped: everything has been released.
	Stopped = owner.Stopped
)

// Harvest publishes an outbox table to Kafka. Create it with New, then Run it, or Start it and
// later Stop and Await it. It runs once.
//
// It is the engine (package internal/engine/owner, which runs each shard's epochs of package
// internal/engine/epoch) with the drivers Config hands it: the store (Store) and the Kafka client
// (Kafka), which makes the producers and the leader election.
type Harvest struct {
	cfg   Config
	owner *owner.Owner
}

// New validates the config (after applying defaults to a copy) and returns a harvester ready
// to start. It does not connect to anything, and needs both drivers, Store and Kafka.
func New(config Config) (*Harvest, error) {
	cfg := config.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	var missing []error
	if cfg.Store == nil {
		missing = append(missing, errors.New("Store: required: the outbox's driver, such as postgres.New(dataSource, outboxTable) of package driver/postgres"))
	}
	if cfg.Kafka == nil {
		missing = append(missing, errors.New("Kafka: required: the Kafka client's driver, such as franz.New(franz.Config{SeedBrokers: brokers}) of package driver/franz"))
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("invalid harvest config: %w", errors.Join(missing...))
	}
	claim, _ := cfg.ClaimStrategy.engineClaim() // Validate refused any other
	kafka := cfg.Kafka
	var tracer trace.Tracer
	if cfg.TracerProvider != nil {
		tracer = cfg.TracerProvider.Tracer("github.com/goharvest/goharvest")
	}
	h := &Harvest{cfg: cfg}
	h.owner = owner.New(owner.Config{
		Name:            cfg.Name,
		Shards:          cfg.Shards,
		Limits:          cfg.Limits,
		Logger:          cfg.Logger,
		Registerer:      cfg.MetricsRegisterer,
		Tracer:          tracer,
		IDHeader:        cfg.IDHeader,
		Claim:           claim,
		NoteGroup:       cfg.LeaderGroupID + NoteGroupSuffix,
		LeaderTopic:     cfg.LeaderTopic,
		TransactionalID: owner.TransactionalID(cfg.LeaderGroupID, 0, 1),
		OpenStore:       func() (driver.DatabaseBinding, error) { return cfg.Store, nil },
		NewElector: func(lost func([]int32)) (driver.Elector, error) {
			return kafka.NewElector(driver.ElectorConfig{
				LeaderTopic:      cfg.LeaderTopic,
				LeaderGroupID:    cfg.LeaderGroupID,
				Partitions:       cfg.Shards,
				Name:             cfg.Name,
				HeartbeatTimeout: cfg.Limits.HeartbeatTimeout,
				PollDuration:     cfg.Limits.PollDuration,
				MinPollInterval:  cfg.Limits.MinPollInterval,
				Barrier:          lost,
				Logger:           cfg.Logger,
			})
		},
		NewProducer: func(shard int) (driver.KafkaProducer, error) {
			return kafka.NewProducer(driver.ProducerConfig{
				TransactionalID: owner.TransactionalID(cfg.LeaderGroupID, shard, cfg.Shards),
				ClientID:        cfg.Name,
				DeliveryTimeout: cfg.Limits.QueueTimeout,
				Logger:          cfg.Logger,
			})
		},
	})
	return h, nil
}

// SetEventHandler registers the handler for events (see package event); call it before Start.
// Events reach it in the order they happen, on a goroutine of its own: a slow handler delays
// later events but never the harvester. It need not be safe for concurrent use.
func (h *Harvest) SetEventHandler(handler func(event.Event)) { h.owner.SetEventHandler(handler) }

// Start opens the outbox and joins the leader election, then returns; the work goes on in the
// background until Stop. It fails if the harvester was started before or cannot be set up.
func (h *Harvest) Start() error { return h.owner.Start() }

// Stop asks the harvester to stop and returns at once; Await waits for it. A leader stops
// marking, waits (up to about MaxPollInterval) for the records it has in flight, and leaves the
// election so that another harvester takes over at once.
func (h *Harvest) Stop() { h.owner.Stop() }

// Await blocks until the harvester has stopped, and returns the error that stopped it, if
// any. It returns at once for a harvester that was never started.
func (h *Harvest) Await() error { return h.owner.Await() }

// Run starts the harvester and stops it when ctx ends. It returns nil after a stop caused by
// ctx, or the error that stopped the harvester.
func (h *Harvest) Run(ctx context.Context) error { return h.owner.Run(ctx) }

// State returns where the harvester is in its lifecycle.
func (h *Harvest) State() State { return h.owner.State() }

// IsLeader reports whether this harvester is publishing now (any shard, with Config.Shards > 1).
func (h *Harvest) IsLeader() bool { return h.owner.IsLeader() }

// LeaderID returns the ID under which this harvester is marking records, or nil when it is not
// the leader. It changes on every remark. With Config.Shards > 1 it is that of the lowest shard
// this harvester leads; LeadShards gives them all.
func (h *Harvest) LeaderID() *uuid.UUID { return h.owner.LeaderID() }

// LeadShards returns the shards this harvester is publishing now, in order, with the leader ID
// of each (see Config.Shards; with one shard, shard 0 while this harvester leads).
func (h *Harvest) LeadShards() map[int]uuid.UUID { return h.owner.LeadShards() }

// ShardCount returns how many shards the outbox has (Config.Shards, after defaults).
func (h *Harvest) ShardCount() int { return h.cfg.Shards }

// InFlightRecords returns how many records are in flight: marked and not yet purged, except the
// records of held keys (see HeldRecords) from the held one on, unless it is being sent again. It
// is the count that Limits.MaxInFlightRecords bounds (see there for how held keys can pass it).
func (h *Harvest) InFlightRecords() int { return h.owner.InFlightRecords() }

// InFlightRecordKeys returns the keys of the records counted by InFlightRecords, each once.
func (h *Harvest) InFlightRecordKeys() []string { return h.owner.InFlightRecordKeys() }

// HeldRecords returns the records that hold back their keys now, oldest first; empty when this
// harvester does not lead.
func (h *Harvest) HeldRecords() []event.HeldRecord { return h.owner.HeldRecords() }

// Healthy reports whether the harvester is running and its loop is alive: nil, or why not. It
// makes no network calls, so it suits a liveness probe.
func (h *Harvest) Healthy() error { return h.owner.Healthy() }

// Ready reports whether the harvester is healthy and can reach both Postgres and Kafka: nil, or
// what is wrong. A standby that is ready can take over at once. It suits a readiness probe.
//
// Answering is not enough for a leader: one whose marks, purges or pre-epoch checks keep
// failing (say, behind a pooler that rejects its statements while it answers pings) publishes
// nothing, and Ready says so, with how long, how many failures and the last error. Such a
// leader publishes nothing, and Ready is what says so: with claimStrategy mark it has no epoch
// running most of the time, so goharvest_leader reads 0 then too; with read (the default) its
// epoch goes on, reading again, and goharvest_leader stays 1. Nor is a leader ready while Kafka
// refuses this client a topic it has records for (driver.RejectedError.Unauthorized): every
// record of that topic waits until the ACL is granted.
func (h *Harvest) Ready(ctx context.Context) error { return h.owner.Ready(ctx) }
