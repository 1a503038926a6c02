package owner

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/epoch"
	"github.com/goharvest/goharvest/internal/wakegrid"
)

// shard is one shard of the outbox and the epochs of this harvester that publish it: an epoch
// runs while this harvester leads the shard's partition of the leader topic.
type shard struct {
	id       int
	db       driver.Store    // marks only this shard's rows
	features driver.Features // db's, found once

	// epoch is the current epoch, nil while this harvester does not publish the shard. Set by
	// the owner goroutine, guarded by Owner.mu, so that other goroutines may read it.
	epoch *epoch.Epoch

	// Owned by the owner goroutine (run):
	starting    *epochStart      // an epoch being prepared, if any
	prevClosed  <-chan struct{}  // closed once the last epoch's producer has closed
	unpurged    []epoch.Unpurged // records the last epochs published and could not purge
	acquired    bool             // the current leadership of the shard has had an epoch already
	nextEpochAt time.Time        // after an error, the next epoch waits for IOErrorBackoff

	backlog atomic.Int64 // the shard's latest backlog sample, -1 when none; written by sampleBacklog
}

// newShards makes the shards of the outbox, with a view of the store for each.
func (h *Owner) newShards(db driver.Store) ([]*shard, error) {
	sharder := driver.FeaturesOf(db).Shards
	if h.cfg.Shards > 1 && sharder == nil {
		return nil, fmt.Errorf("harvest: Shards is %d, but the database binding (%T) cannot mark by shard", h.cfg.Shards, db)
	}
	closed := make(chan struct{})
	close(closed)
	shards := make([]*shard, h.cfg.Shards)
	for i := range shards {
		s := &shard{id: i, db: db, prevClosed: closed}
		if h.cfg.Shards > 1 {
			view, err := driver.AsStore(sharder.Shard(i, h.cfg.Shards))
			if err != nil {
				return nil, fmt.Errorf("harvest: shard %d: %w", i, err)
			}
			s.db = view
		}
		s.features = driver.FeaturesOf(s.db)
		s.backlog.Store(-1)
		shards[i] = s
	}
	return shards, nil
}

// signal wakes the owner loop, without waiting: one pending wake-up serves any number of reasons,
// since the loop looks at every shard each time.
func (h *Owner) signal() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// endEpoch drains and closes a shard's epoch, within about MaxPollInterval, then reports why it
// ended (nil for a remark, which LeaderRefreshed reports when the next epoch starts).
func (h *Owner) endEpoch(s *shard, why event.Event) {
	if p := h.epochOf(s); p != nil {
		unpurged, closed := p.Stop(h.cfg.Limits.MaxPollInterval)
		if len(unpurged.IDs) > 0 {
			s.unpurged = append(s.unpurged, unpurged)
		}
		s.prevClosed = closed
		h.mu.Lock()
		s.epoch = nil
		h.mu.Unlock()
		h.metrics.Leader.Set(float64(len(h.epochs())))
	} else if !s.acquired {
		return // no epoch of this leadership has run: no leadership to report lost
	}
	if _, fenced := why.(event.LeaderFenced); fenced {
		h.metrics.Fences.Inc()
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
func (h *Owner) endShards(shards []*shard, why func(*shard) event.Event) {
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
func (h *Owner) leadershipLost(partitions []int32) {
	var lost []*shard
	for _, s := range h.shards {
		if slices.Contains(partitions, int32(s.id)) {
			lost = append(lost, s)
		}
	}
	h.endShards(lost, func(s *shard) event.Event { return h.lossEvent(s.id) })
}

// lossEvent says how leadership of a shard was lost.
func (h *Owner) lossEvent(shard int) event.Event {
	if h.elector.Fenced() {
		return event.LeaderFenced{Shard: shard}
	}
	return event.LeaderRevoked{Shard: shard}
}

// sampleBacklog keeps the backlog metrics current while this harvester leads: the whole outbox's,
// and with Config.Shards > 1 each led shard's. It samples on the process's wake grid, so that the
// samplers of a reaper's outboxes wake together.
func (h *Owner) sampleBacklog() {
	sampler := h.features.Backlog
	if sampler == nil {
		return
	}
	every := h.cfg.Limits.BacklogSampleInterval
	for {
		select {
		case <-h.done:
			return
		case <-time.After(time.Until(wakegrid.Next(time.Now(), every))):
		}
		led := h.LeadShards()
		if len(led) == 0 {
			continue
		}
		if h.idle(led) {
			// Known to be empty: no query, so that an idle outbox holds no pool connection.
			h.metrics.Backlog.Set(0)
			h.metrics.OldestAge.Set(0)
			for _, s := range h.shards {
				if _, leads := led[s.id]; leads {
					s.backlog.Store(0)
				} else {
					s.backlog.Store(-1)
				}
			}
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), h.cfg.Limits.BacklogSampleInterval)
		n, oldest, err := sampler.Backlog(ctx, backlogLimit)
		if err == nil { // else the database's trouble is counted and logged where it matters
			h.metrics.Backlog.Set(float64(n))
			if oldest.IsZero() {
				h.metrics.OldestAge.Set(0)
			} else {
				h.metrics.OldestAge.Set(time.Since(oldest).Seconds())
			}
		}
		for _, s := range h.shards {
			if _, leads := led[s.id]; !leads {
				s.backlog.Store(-1)
				continue
			}
			n, err := n, err // one shard is the whole outbox, sampled above
			if h.cfg.Shards > 1 {
				n, _, err = s.features.Backlog.Backlog(ctx, backlogLimit) // a view of the same binding
			}
			if err == nil {
				s.backlog.Store(int64(n))
			}
		}
		cancel()
	}
}

// idle reports whether this harvester leads every shard, led, and each one's epoch knows its rows
// to be none (epoch.Idle): then the whole outbox is empty, and the backlog sampler need not ask.
func (h *Owner) idle(led map[int]uuid.UUID) bool {
	if len(led) != len(h.shards) {
		return false
	}
	for _, s := range h.shards {
		if p := h.epochOf(s); p == nil || !p.Idle() {
			return false
		}
	}
	return true
}

// backlogLimit bounds the count behind goharvest_outbox_backlog_records, so that sampling stays
// cheap however large the backlog grows.
const backlogLimit = 1_000_000

// shardCollector reports, for each shard this harvester publishes, its in-flight records and
// its backlog, labelled by shard, and goharvest_shard_leader for every shard (1 where this
// harvester publishes it): read at collection time from the shards' owners, so never stale.
type shardCollector struct {
	h                         *Owner
	leader, inFlight, backlog *prometheus.Desc
}

func newShardCollector(name string, h *Owner) *shardCollector {
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
	epochs := make([]*epoch.Epoch, len(shards))
	for i, s := range shards {
		epochs[i] = s.epoch
	}
	c.h.mu.Unlock()
	for i, s := range shards {
		label := strconv.Itoa(s.id)
		led := 0.0
		if p := epochs[i]; p != nil {
			led = 1
			_, n := p.InFlight()
			ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(n), label)
			if b := s.backlog.Load(); b >= 0 {
				ch <- prometheus.MustNewConstMetric(c.backlog, prometheus.GaugeValue, float64(b), label)
			}
		}
		ch <- prometheus.MustNewConstMetric(c.leader, prometheus.GaugeValue, led, label)
	}
}

// TransactionalIDPrefix is put before the election group's ID to make its producers'
// transactional IDs.
const TransactionalIDPrefix = "goharvest."

// TransactionalID is the transactional ID of a shard's producers, which every harvester of the
// outbox shares for that shard: goharvest.<group>, or goharvest.<group>.<shard> when the outbox
// has more than one shard (goharvest.TransactionalID).
func TransactionalID(leaderGroupID string, shard, shards int) string {
	if shards <= 1 {
		return TransactionalIDPrefix + leaderGroupID
	}
	return TransactionalIDPrefix + leaderGroupID + "." + strconv.Itoa(shard)
}
