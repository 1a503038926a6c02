package owner

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/epoch"
	"github.com/goharvest/goharvest/internal/outage"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/metric"
)

// inFlightSampler reads the harvester's in-flight count and keys every 50µs (of a bubble's clock,
// in the tests that run in one), until stopped, and keeps the highest count and any disagreement
// between the two.
type inFlightSampler struct {
	h        *Owner
	done     chan struct{}
	stopOnce sync.Once
	finished sync.WaitGroup

	mu       sync.Mutex
	max      int
	mismatch string // a moment when there were more keys than records
}

// sampleInFlight starts sampling h; the sampling stops at the test's end if not before, so that
// a test that fails first leaves no goroutine behind (which a bubble would not end with).
func sampleInFlight(t *testing.T, h *Owner) *inFlightSampler {
	s := &inFlightSampler{h: h, done: make(chan struct{})}
	t.Cleanup(func() { s.stop() })
	s.finished.Go(func() {
		tick := time.NewTicker(50 * time.Microsecond) // the sampling's period
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
			}
			n, keys := h.InFlightRecords(), h.InFlightRecordKeys()
			s.mu.Lock()
			s.max = max(s.max, n)
			// The two are read one after the other, so they may differ by what changed between; many
			// more keys than records would mean they count different things.
			if len(keys) > n+h.cfg.Limits.MaxInFlightRecords && s.mismatch == "" {
				s.mismatch = fmt.Sprintf("%d keys, %d records", len(keys), n)
			}
			s.mu.Unlock()
		}
	})
	return s
}

// stop ends the sampling and returns the highest count seen.
func (s *inFlightSampler) stop() int {
	s.stopOnce.Do(func() { close(s.done) })
	s.finished.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.max
}

// InFlightRecords reports what MaxInFlightRecords bounds, so it never passes the limit, and it
// is not stuck at zero either: the pipeline fills up to the limit under a backlog. Kafka sees
// as much: never more than the limit at once, and more than one.
func TestInFlightRecordsWithinLimit(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		limits := fastLimits()
		limits.MaxInFlightRecords = 5
		r := newRig(t, limits)
		r.kafka.delay = 2 * time.Millisecond
		ids := r.load(100, 3)
		s := sampleInFlight(t, r.h)
		r.runUntilEmpty()
		highest := s.stop()
		r.checkOrder(ids)
		if highest > limits.MaxInFlightRecords {
			t.Errorf("InFlightRecords reported %d; MaxInFlightRecords is %d", highest, limits.MaxInFlightRecords)
		}
		if highest < 2 {
			t.Errorf("InFlightRecords reported at most %d with a backlog of %d", highest, len(ids))
		}
		if s.mismatch != "" {
			t.Errorf("InFlightRecordKeys and InFlightRecords disagree: %s", s.mismatch)
		}
		if n := r.h.InFlightRecords(); n != 0 {
			t.Errorf("InFlightRecords is %d once stopped", n)
		}
		if r.kafka.maxOut > 5 {
			t.Fatalf("%d records were in flight at once; the limit is 5", r.kafka.maxOut)
		}
		if r.kafka.maxOut < 2 {
			t.Fatalf("at most %d record in flight: the pipeline did not pipeline", r.kafka.maxOut)
		}
	})
}

// A held key's records are left out of the in-flight count, by design (held.go), but for the
// held record while it is sent again: the count stays within the limit plus that one while the
// other keys drain past it, and once they are done nothing is counted though 201 rows wait, and
// no key is reported in flight.
func TestInFlightRecordsLeaveOutHeldKeys(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		l := heldLimits()
		r := newRig(t, l)
		var recs []driver.OutboxRecord
		for i := range 201 {
			recs = append(recs, driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "bad", KafkaValue: String(fmt.Sprint(i))})
		}
		bad := r.add(recs...)
		others := r.load(20, 10)
		r.kafka.setReject(bad[0], 1<<30)
		r.start()
		r.waitFor("the record to be held", 10*time.Second, func() bool { return len(r.h.HeldRecords()) == 1 })
		s := sampleInFlight(t, r.h)
		r.waitFor("other keys to drain past the held key", 10*time.Second, func() bool { return r.db.len() == len(bad) })
		r.waitBudgetEmpty()
		highest := s.stop()
		if highest > l.MaxInFlightRecords+1 {
			t.Errorf("InFlightRecords reported %d while a key was held; MaxInFlightRecords is %d", highest, l.MaxInFlightRecords)
		}
		r.waitFor("the held record's retry to end", 5*time.Second, func() bool { return r.h.InFlightRecords() == 0 })
		if keys := r.h.InFlightRecordKeys(); len(keys) != 0 {
			t.Errorf("keys %v in flight with none of their records counted", keys)
		}
		r.kafka.setReject(bad[0], 0)
		r.waitEmpty(30 * time.Second)
		r.waitBudgetEmpty()
		r.stop()
		r.checkOrder(append(bad, others...))
	})
}

// 8 shards draining in one process commit about as often as 1, and a busy shard beside idle ones
// as often as a lone one. The marker is kept busy (each mark takes 2 ms and returns 10 records,
// each of a key of its own), so that no transaction stalls and commits early but the last; the
// other epochs are stood in for by the count they would add.
func TestCommitsSpacedByBusyEpochs(t *testing.T) {
	for _, others := range []int32{0, 7} {
		t.Run(fmt.Sprintf("others=%d", others), func(t *testing.T) {
			inBubble(t, func(t *testing.T) {
				busy := new(atomic.Int32)
				busy.Store(others)
				gaps := commitGapsUnderLoad(t, busy)
				if len(gaps) < 4 {
					t.Fatalf("only %d commits under load", len(gaps)+1)
				}
				slices.Sort(gaps)
				want := time.Duration(others+1) * 10 * time.Millisecond
				if median := gaps[len(gaps)/2]; median < want {
					t.Errorf("commits %v apart (median of %d), want at least %v with %d other epochs busy", median, len(gaps), want, others)
				}
				if others == 0 && len(gaps) < 20 {
					// A lone epoch must not wait as if others were busy: 2,000 records at 5 a millisecond
					// take 400 ms, 40 lingers of 10 ms.
					t.Errorf("a lone epoch committed only %d times in a drain of 400 ms", len(gaps)+1)
				}
				if n := busy.Load(); n != others {
					t.Errorf("the epoch left itself counted as busy: %d busy, want the others' %d", n, others)
				}
			})
		})
	}
}

// commitGapsUnderLoad drains 2,000 records through one epoch and returns the times between the
// starts of its commits, the last one's left out (it commits as soon as the outbox is empty).
func commitGapsUnderLoad(t *testing.T, busy *atomic.Int32) []time.Duration {
	limits := fastLimits()
	limits.MarkQueryRecords = 10
	limits.MaxInFlightRecords = 100_000
	limits = limits.WithDefaults()
	db := newFakeDB()
	db.markDelay = 2 * time.Millisecond
	for i := range 2000 {
		db.insert(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: fmt.Sprint("k", i), KafkaValue: String("v")})
	}
	k := newFakeKafka(t, db)
	var mu sync.Mutex
	var starts []time.Time
	k.onCommit = func() {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
	}
	producer, _ := k.provider(0)
	if err := producer.InitTransactions(context.Background()); err != nil {
		t.Fatal(err)
	}
	p := epoch.Start(epoch.Deps{
		LeaderID: uuid.New(), Limits: limits, Store: db, Features: driver.FeaturesOf(db), Producer: producer,
		Log: slog.New(slog.DiscardHandler), Emit: func(event.Event) {}, Meter: metric.NewMeter("t", time.Hour),
		DBTrouble: &outage.Logger{What: "database"}, Metrics: epoch.NewMetrics("t", nil, nil),
		Leading: func() bool { return true }, BusyEpochs: busy,
	})
	if !testwait.Until(20*time.Second, func() bool { return db.len() == 0 }) {
		t.Fatalf("%d records left after 20 s", db.len())
	}
	p.Stop(limits.MaxPollInterval)
	mu.Lock()
	defer mu.Unlock()
	var gaps []time.Duration
	for i := 1; i < len(starts)-1; i++ {
		gaps = append(gaps, starts[i].Sub(starts[i-1]))
	}
	return gaps
}
