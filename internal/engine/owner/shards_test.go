package owner

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/epoch"
)

// Shards need a binding that can mark by shard; one that cannot is refused at Start, by name,
// rather than publish every shard's rows from every shard's epoch.
func TestShardsNeedAShardingBinding(t *testing.T) {
	r := newRig(t, epoch.Limits{})
	h := New(Config{
		Name:        "test",
		Shards:      4,
		Limits:      epoch.Limits{}.WithDefaults(),
		Logger:      slog.New(slog.DiscardHandler),
		Registerer:  r.registry,
		OpenStore:   func() (driver.DatabaseBinding, error) { return r.db, nil },
		NewElector:  r.elector.provider,
		NewProducer: r.kafka.provider,
	})
	err := h.Start()
	if err == nil || !strings.Contains(err.Error(), "Shards is 4") || !strings.Contains(err.Error(), "cannot mark by shard") {
		t.Fatalf("Start returned %v, want an error saying the binding cannot mark by shard", err)
	}
	if h.State() != Created {
		t.Fatalf("a refused Start left the harvester %v", h.State())
	}
}

// Leadership lost while a shard is between two epochs (the last one ended for a remark and the
// next cannot start yet) is still reported: every LeaderAcquired is followed by a loss.
func TestLossBetweenEpochsIsReported(t *testing.T) {
	r := newRig(t, fastLimits())
	r.start()
	r.waitFor("leadership", 5*time.Second, r.h.IsLeader)
	r.kafka.mu.Lock()
	r.kafka.initErr = errors.New("coordinator not available") // the next epoch cannot start
	r.kafka.produceFatal = true                               // the first produce ends this one
	r.kafka.mu.Unlock()
	r.load(1, 1)
	r.waitFor("the epoch to end for a remark", 5*time.Second, func() bool { return !r.h.IsLeader() })
	r.elector.revoke()
	r.waitFor("the loss to be reported", 5*time.Second, func() bool { return countEvents[event.LeaderRevoked](r.events) > 0 })
	if acquired, lost := countEvents[event.LeaderAcquired](r.events), countEvents[event.LeaderRevoked](r.events); acquired != 1 || lost != 1 {
		t.Fatalf("%d LeaderAcquired, %d LeaderRevoked; want one of each", acquired, lost)
	}
}

// A harvester counts an epoch as busy while its marker finds rows, and no longer once the outbox
// is empty or the epoch has ended: every epoch of the harvester spaces its commits by that count
// (lingerFor), so a count left behind would slow the next epochs' commits for good.
func TestBusyEpochsFollowTheBacklog(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		// 200 marks of at least a millisecond each to a backlog: the epoch is busy for a while.
		limits := fastLimits()
		limits.MarkQueryRecords = 10
		r := newRig(t, limits)
		r.db.markDelay = time.Millisecond
		ids := r.load(100, 20)
		r.start()
		r.waitFor("the epoch to count as busy", 5*time.Second, func() bool { return r.h.busyEpochs.Load() == 1 })
		r.waitEmpty(20 * time.Second)
		r.waitFor("the epoch to count as idle", 5*time.Second, func() bool { return r.h.busyEpochs.Load() == 0 })
		r.load(100, 20)
		r.waitFor("the epoch to count as busy again", 5*time.Second, func() bool { return r.h.busyEpochs.Load() == 1 })
		r.stop()
		if n := r.h.busyEpochs.Load(); n != 0 {
			t.Errorf("%d epochs counted as busy once stopped", n)
		}
		r.checkOrder(ids)
	})
}
