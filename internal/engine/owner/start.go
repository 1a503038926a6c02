package owner

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/epoch"
)

// epochStart is an epoch being prepared on a goroutine of its own: the schema check, a new
// producer whose InitTransactions fences the producers of every earlier epoch of the shard, and
// the purge of records earlier epochs published and did not purge. It belongs to the owner
// goroutine.
type epochStart struct {
	cancel context.CancelFunc
	done   chan struct{} // closed when the fields below are set
	// producer is ready to publish; nil when a step failed and the start is to be retried.
	producer driver.KafkaProducer
	// err is a failure that retrying cannot cure (Kafka refusing the harvester's settings); it
	// stops the harvester.
	err error
}

// beginEpoch starts preparing an epoch of a shard. Every step that cannot be cancelled
// (librdkafka's InitTransactions honours only a deadline) is bounded by MaxPollInterval, so that
// abandonStart, which a handover waits for, returns within that bound.
func (h *Owner) beginEpoch(ctx context.Context, s *shard) *epochStart {
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
func (h *Owner) prepareEpoch(ctx context.Context, s *shard, unpurged []epoch.Unpurged) (driver.KafkaProducer, error) {
	// Each step first checks that the start has not been abandoned: above all InitTransactions,
	// which would otherwise fence a leader elected meanwhile.
	if ctx.Err() != nil || !h.schemaReady(ctx) {
		return nil, nil
	}
	// Records this harvester committed to Kafka and could not purge when its last epochs ended
	// would otherwise be marked and published again. Each is purged on the server it was read
	// from, and left where that server is gone (purgeIDs).
	for _, u := range unpurged {
		if !h.purgeIDs(driver.WithServer(ctx, u.Server), "purge records the last epoch published", u.IDs) {
			return nil, nil
		}
	}
	if ctx.Err() != nil {
		return nil, nil
	}
	producer, err := h.cfg.NewProducer(s.id)
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
	var refused *driver.KafkaConfigError
	if errors.As(err, &refused) {
		producer.Close()
		if h.cfg.Shards > 1 {
			// Each shard has a transactional ID of its own; one ACL can cover them all.
			return nil, fmt.Errorf("harvest: Kafka refuses the producer's settings or permissions (a PREFIXED ACL on TransactionalId %s. covers every shard's): %w",
				h.cfg.TransactionalID, err)
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
func (h *Owner) abandonStart(s *shard) {
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
func (h *Owner) launchEpoch(s *shard, producer driver.KafkaProducer) {
	s.unpurged = nil
	leaderID := uuid.New()
	p := epoch.Start(epoch.Deps{
		LeaderID:   leaderID,
		Claim:      h.claimer(s, leaderID),
		Limits:     h.cfg.Limits,
		Store:      s.db,
		Features:   s.features,
		Producer:   producer,
		Log:        h.log.With("shard", s.id),
		Emit:       h.emit,
		Meter:      h.meter,
		DBTrouble:  h.dbTrouble,
		Notify:     h.notifyTrouble,
		Metrics:    h.metrics,
		Tracer:     h.cfg.Tracer,
		Leading:    func() bool { return slices.Contains(h.elector.Partitions(), int32(s.id)) },
		Notes:      h.notePlace(s.id),
		IDHeader:   h.cfg.IDHeader,
		Failures:   h.failures,
		OnRemark:   h.signal,
		BusyEpochs: &h.busyEpochs,
	})
	h.mu.Lock()
	s.epoch = p
	h.mu.Unlock()
	h.metrics.Leader.Set(float64(len(h.epochs())))
	if s.acquired {
		h.metrics.Remarks.Inc()
		h.log.Info("leader refreshed", "leaderID", leaderID, "shard", s.id)
		h.emit(event.LeaderRefreshed{Shard: s.id, LeaderID: leaderID})
	} else {
		h.metrics.Elections.Inc()
		h.log.Info("leader acquired", "leaderID", leaderID, "shard", s.id)
		h.emit(event.LeaderAcquired{Shard: s.id, LeaderID: leaderID})
	}
}

// notePlace is where a shard's transactions leave their notes (see internal/engine/epoch/note.go).
func (h *Owner) notePlace(shard int) driver.NotePlace {
	return driver.NotePlace{Group: h.cfg.NoteGroup, Topic: h.cfg.LeaderTopic, Partition: int32(shard)}
}

// purgeNoted purges the records that the shard's latest committed note lists: an earlier epoch
// published them and may have stopped before purging them. InitTransactions has settled every
// earlier transaction of the shard, so the note read is final. It reports false, to be retried,
// when Kafka or the database fails, with an error when Kafka refuses to let it read the note
// (a KafkaConfigError: retrying cannot help).
func (h *Owner) purgeNoted(ctx context.Context, s *shard, producer driver.KafkaProducer) (bool, error) {
	place := h.notePlace(s.id)
	readCtx, cancel := context.WithTimeout(ctx, h.cfg.Limits.MaxPollInterval)
	note, err := producer.ReadNote(readCtx, place)
	cancel()
	var refused *driver.KafkaConfigError
	if errors.As(err, &refused) {
		return false, fmt.Errorf("harvest: Kafka refuses the permissions the note needs: %w", err)
	}
	if err != nil {
		if ctx.Err() == nil {
			h.kafkaTrouble.Fail(h.log, "read note", err, "shard", s.id)
		}
		return false, nil
	}
	noted, err := epoch.DecodeNote(note)
	if err != nil {
		// Not ours to interpret: someone else wrote to the group. Publishing on would risk a run
		// going out again whole, so wait for an operator.
		h.kafkaTrouble.Fail(h.log, "read note of group "+place.Group, err, "shard", s.id)
		return false, nil
	}
	var byID []int64 // a format 1 note's, which has no fingerprints
	fingerprints := map[int64]uint32{}
	for _, r := range noted {
		if r.Fingerprinted {
			fingerprints[r.ID] = r.Fingerprint
		} else {
			byID = append(byID, r.ID)
		}
	}
	if len(byID) > 0 && !h.purgeIDs(ctx, "purge noted records", byID) {
		return false, nil
	}
	return h.purgeFingerprinted(ctx, fingerprints), nil
}

// purgeFingerprinted purges the noted rows that still have the fingerprint the note gives them
// (epoch.Fingerprint): it reads them, and deletes each only if it is still the version read. A
// row with another fingerprint took the id after the noted record's row went (a failover to an
// asynchronous standby): it is left, to be published. It reports false, to be retried, when the
// database fails.
func (h *Owner) purgeFingerprinted(ctx context.Context, fingerprints map[int64]uint32) bool {
	if len(fingerprints) == 0 {
		return true
	}
	ids := slices.Collect(maps.Keys(fingerprints))
	readCtx, cancel := context.WithTimeout(ctx, h.cfg.Limits.QueueTimeout)
	rows, err := h.db.Reread(readCtx, ids)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			h.dbTrouble.Fail(h.log, "read noted records", err)
		}
		return false
	}
	versions := map[int64]string{}
	var others []int64
	for _, row := range rows {
		if epoch.Fingerprint(row.OutboxRecord) == fingerprints[row.ID] {
			versions[row.ID] = row.Version
		} else {
			others = append(others, row.ID)
		}
	}
	if len(others) > 0 {
		h.log.Warn("rows with the ids of noted records are other rows now (ids handed out again after a failover?); they are published, not purged",
			"ids", others)
	}
	if len(versions) == 0 {
		return true
	}
	purgeCtx, cancel := context.WithTimeout(ctx, h.cfg.Limits.QueueTimeout)
	purged, err := h.db.PurgeUnchanged(purgeCtx, versions)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			h.dbTrouble.Fail(h.log, "purge noted records", err)
		}
		return false
	}
	if len(purged) > 0 {
		h.log.Info("purged records an earlier leader published and had not purged", "records", len(purged), "op", "purge noted records")
	}
	return true
}

// purgeIDs deletes the rows of records that an earlier epoch published, before this one marks
// anything. It reports false, to be retried, when the database fails. A purge bound to a server
// (driver.WithServer) that finds another one (a failover since the records were read) deletes
// nothing: on a promoted standby that lacked the old primary's last inserts, their ids can name
// new rows. The records are left, and published again where their rows are still there.
func (h *Owner) purgeIDs(ctx context.Context, op string, ids []int64) bool {
	n := 0
	for batch := range slices.Chunk(ids, epoch.MaxCommitBatch) {
		purgeCtx, cancel := context.WithTimeout(ctx, h.cfg.Limits.QueueTimeout)
		purged, err := h.db.Purge(purgeCtx, batch)
		cancel()
		if errors.Is(err, driver.ErrServerChanged) {
			h.log.Warn("records an earlier epoch published are not purged: the database server changed since they were read (a failover?), and their ids may name other rows now; those whose rows are there are published again",
				"records", len(ids), "op", op)
			break
		}
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
func (h *Owner) schemaReady(ctx context.Context) bool {
	checker := h.features.Schema
	if checker == nil {
		return true
	}
	checkCtx, cancel := context.WithTimeout(ctx, h.cfg.Limits.QueueTimeout)
	defer cancel()
	err := checker.CheckSchema(checkCtx)
	var schemaErr *driver.SchemaError
	switch {
	case errors.As(err, &schemaErr):
		h.mu.Lock()
		changed := schemaErr.Error() != h.schemaProblem
		h.schemaProblem = schemaErr.Error()
		h.mu.Unlock()
		if changed {
			h.log.Error("cannot publish: the outbox table does not fit; alter it and publishing starts", "error", err)
			h.emit(event.SchemaRejected{Err: err})
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

// claimer returns how a shard's new epoch claims its rows (Config.Claim). Start refused a store
// that cannot read when the claim is by reading.
func (h *Owner) claimer(s *shard, leaderID uuid.UUID) epoch.Claimer {
	if h.cfg.Claim == ClaimByReading {
		return epoch.ReadClaim(s.features.Read)
	}
	return epoch.MarkClaim(s.db, leaderID)
}
