package owner

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/epoch"
)

// pulsesWithin counts the election's pulses over d.
func (r *rig) pulsesWithin(d time.Duration) int {
	before := r.elector.pulses()
	advanceTo(time.Now().Add(d)) // the window the pulses are counted over
	return r.elector.pulses() - before
}

// hung counts the calls that have met a hang of the database or of InitTransactions.
func (r *rig) hung() int {
	r.db.mu.Lock()
	db := r.db.hung
	r.db.mu.Unlock()
	r.kafka.mu.Lock()
	defer r.kafka.mu.Unlock()
	return db + r.kafka.initHung
}

// electHung makes the contender the leader and waits until the epoch start it begins hangs.
func (r *rig) electHung() {
	r.t.Helper()
	before := r.hung()
	r.elector.set(stateLeader)
	r.waitFor("an epoch start to hang", 5*time.Second, func() bool { return r.hung() > before })
}

// timeStop stops the harvester and returns how long that took.
func (r *rig) timeStop() time.Duration {
	r.t.Helper()
	began := time.Now()
	r.stop()
	return time.Since(began)
}

// While an epoch's start hangs on Kafka (InitTransactions) or on the database (the purge of
// noted records), the election keeps pulsing, a revoke is served within the handover bound, and
// Stop returns promptly. QueueTimeout is left at its 30s default, which bounded each of those
// steps before they moved off the owner goroutine.
func TestElectionPulsesWhileEpochStartHangs(t *testing.T) {
	for _, c := range []struct {
		name string
		hang func(*rig)
	}{
		{"InitTransactions", func(r *rig) { r.kafka.initHang = true }},
		{"database", func(r *rig) {
			r.kafka.broker.SetNote(rigNotes, epoch.EncodeNote([]epoch.Noted{{ID: 1 << 40}})) // a record long gone
			r.db.setHang(true)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			inBubble(t, func(t *testing.T) {
				limits := fastLimits() // heartbeat timeout 1s, so MaxPollInterval 500ms
				r := newRig(t, limits)
				ids := r.load(5, 5)
				c.hang(r)
				r.start()
				if n := r.pulsesWithin(time.Second); n < 20 {
					t.Fatalf("%d pulses in 1s while the epoch start hung; MinPollInterval 10ms allows about 100", n)
				}
				if r.h.IsLeader() {
					t.Fatal("leading while the epoch start hangs")
				}

				// A revoke waits for the start, which the barrier cancels.
				r.elector.revoke()
				began := time.Now()
				r.waitFor("the revoke", 5*time.Second, func() bool {
					return r.elector.revokeDone() && r.elector.pulses() > 0
				})
				r.waitFor("the barrier", 5*time.Second, func() bool { return r.h.pulseAge() < 50*time.Millisecond })
				if took := time.Since(began); took > 2*limits.HeartbeatTimeout {
					t.Errorf("the handover took %v; the group allows 2 heartbeat timeouts", took)
				}

				// Leadership returns, the fault clears, and everything is published.
				r.electHung() // an epoch start begins, and hangs, before the fault clears
				r.kafka.mu.Lock()
				r.kafka.initHang = false
				r.kafka.mu.Unlock()
				r.db.setHang(false)
				r.waitEmpty(10 * time.Second)
				r.checkOrder(ids)

				// Stop while a start hangs again.
				r.elector.revoke()
				r.waitFor("the revoke", 5*time.Second, func() bool { return !r.h.IsLeader() })
				c.hang(r)
				r.electHung() // the epoch start begins and hangs before Stop
				if took := r.timeStop(); took > 2*limits.HeartbeatTimeout {
					t.Errorf("Stop took %v while the epoch start hung", took)
				}
			})
		})
	}
}

// pulseAge is how long ago the owner loop last pulsed.
func (h *Owner) pulseAge() time.Duration {
	return time.Since(time.Unix(0, h.lastPulse.Load()))
}

// librdkafka refuses new messages while a transaction must be aborted or is being committed
// ("Erroneous state"). That is no fault of those records: only the records Kafka refused are
// reported, counted and backed off.
//
// Not in a bubble: with the bug it guards, send workers wait for txnMu while a commit holding it
// waits for the broker's latency, which stops a bubble's clock (see inBubble); the test would
// hang rather than fail.
func TestErroneousStateIsNoRefusal(t *testing.T) {
	r := newRig(t, fastLimits())
	r.kafka.delay = 5 * time.Millisecond
	ids := r.load(100, 20)
	var rejected []int64
	for i := 30; i < len(ids); i += 100 {
		rejected = append(rejected, ids[i])
		r.kafka.rejectN[ids[i]] = 1
	}
	r.runUntilEmpty()
	r.checkOrder(ids)
	var failed []int64
	for _, e := range r.events.all() {
		if f, ok := e.(event.RecordFailed); ok {
			failed = append(failed, f.ID)
		}
	}
	slices.Sort(failed)
	if !slices.Equal(failed, rejected) {
		t.Errorf("RecordFailed for %v, want exactly the rejected records %v", failed, rejected)
	}
	if got := testutil.ToFloat64(r.h.metrics.Failed); got != float64(len(rejected)) {
		t.Errorf("goharvest_records_failed_total = %v, want %d", got, len(rejected))
	}
	if n := strings.Count(r.logs.String(), "Erroneous state"); n == 0 {
		t.Log("no produce met an erroneous state; the test exercised nothing new")
		t.Fail()
	}
}

// A commit that times out is still under way in librdkafka, which refuses an abort meanwhile;
// the pipeline calls CommitTransaction again until it resolves, without ending the epoch,
// resetting records or reporting any as failed.
func TestSlowCommitIsRetriedNotAbandoned(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		limits := fastLimits()
		limits.MaxKeyRun = 1
		r := newRig(t, limits)
		r.kafka.delay = time.Millisecond
		ids := r.load(20, 10)
		// Each stalled call waits out its deadline: together longer than a heartbeat timeout.
		r.kafka.commitStalls = 4
		r.runUntilEmpty()
		r.checkOrder(ids)
		if n := countEvents[event.LeaderRefreshed](r.events); n != 0 {
			t.Errorf("%d remarks: a slow commit ended the epoch", n)
		}
		if n := countEvents[event.RecordFailed](r.events); n != 0 {
			t.Errorf("%d RecordFailed events for records of a slow commit", n)
		}
		if got := testutil.ToFloat64(r.h.metrics.Reset); got != 0 {
			t.Errorf("%v records reset", got)
		}
		seen := map[int64]int{}
		for _, p := range r.kafka.published() {
			seen[p.id]++
			if seen[p.id] > 1 {
				t.Errorf("record %d published twice", p.id)
			}
		}
	})
}

// While a commit stalls, a revoke ends the epoch within the handover bound: about one
// MaxPollInterval (half a heartbeat timeout here), well within what the group allows (see
// neli/doc.go). The test allows a whole heartbeat timeout, for a busy machine.
func TestHandoverBoundedWhileCommitStalls(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		limits := fastLimits()
		limits.MaxKeyRun = 1
		r := newRig(t, limits)
		r.kafka.delay = time.Millisecond
		ids := r.load(20, 50)
		r.start()
		r.waitFor("some progress", 10*time.Second, func() bool { return r.db.len() < len(ids)-50 })
		r.kafka.mu.Lock()
		r.kafka.commitStalls = 1000
		r.kafka.mu.Unlock()
		r.waitFor("a commit to stall", 5*time.Second, func() bool {
			r.kafka.mu.Lock()
			defer r.kafka.mu.Unlock()
			return r.kafka.commitStalls < 1000
		})
		r.elector.revoke()
		began := time.Now()
		r.waitFor("the handover", 5*time.Second, func() bool {
			return r.elector.revokeDone()
		})
		r.waitFor("the barrier to return", 5*time.Second, func() bool { return r.h.pulseAge() < 50*time.Millisecond })
		if took, bound := time.Since(began), limits.HeartbeatTimeout; took > bound {
			t.Errorf("the handover took %v; MaxPollInterval is %v", took, limits.MaxPollInterval)
		}
		r.kafka.mu.Lock()
		r.kafka.commitStalls = 0
		r.kafka.mu.Unlock()
		r.elector.set(stateLeader)
		r.waitEmpty(20 * time.Second)
		r.stop()
		r.checkOrder(ids)
	})
}

// Kafka refusing the producer's settings or permissions (a missing ACL on the transactional ID)
// cannot be cured by retrying: the harvester stops with an error that says so.
func TestKafkaConfigErrorStopsTheHarvester(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		r := newRig(t, fastLimits())
		r.kafka.initErr = &driver.KafkaConfigError{Err: errors.New("Broker: Transactional Id authorization failed")}
		if err := r.h.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.h.Await() }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "authorization failed") || !strings.Contains(err.Error(), "permissions") {
				t.Fatalf("Await returned %v, want the refusal explained", err)
			}
		case <-time.After(10 * time.Second):
			r.h.Stop()
			t.Fatal("the harvester kept retrying an InitTransactions that Kafka refuses for good")
		}
	})
}

// Records committed to Kafka whose purge had to be given up when an epoch ended are purged
// before the next epoch of this harvester marks anything, rather than published again.
func TestNextEpochPurgesWhatTheLastCouldNot(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		limits := fastLimits()
		limits.MaxKeyRun = 1
		r := newRig(t, limits)
		r.kafka.delay = time.Millisecond
		ids := r.load(20, 20)
		r.endEpochLeavingUnpurged(ids)
		r.db.setFailPurges(false)
		r.elector.set(stateLeader)
		r.waitEmpty(10 * time.Second)
		r.stop()
		r.checkOrder(ids)
		seen := map[int64]int{}
		for _, p := range r.kafka.published() {
			if seen[p.id]++; seen[p.id] == 2 {
				t.Errorf("record %d published again", p.id)
			}
		}
		if !strings.Contains(r.logs.String(), "purge records the last epoch published") {
			t.Error("the purge of the last epoch's records was not logged")
		}
	})
}

// The order guarantee across epochs, exactly: records of one key whose transactions overlapped
// may be published in either order, and a record committed but not purged when its leader died
// is published again after a concurrent one with a lower id that committed late: 11 10 11. A
// record is never published after one that was written after it committed.
func TestConcurrentRecordsAcrossEpochs(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		limits := fastLimits()
		limits.MaxKeyRun = 1
		r := newRig(t, limits)
		eleven := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "k", KafkaValue: String("11")})[0]
		r.db.SkipIDs(5) // ids below eleven taken by transactions still open
		r.db.setFailPurges(true)
		r.start()
		r.waitFor("11 to be committed", 10*time.Second, func() bool { return len(r.kafka.published()) == 1 })
		// The leader dies: the next one knows nothing of what it could not purge.
		r.h.Stop()
		if err := r.h.Await(); err != nil {
			t.Fatal(err)
		}
		ten := eleven - 1
		r.db.InsertAt(ten, driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "k", KafkaValue: String("10")})
		r.db.setFailPurges(false)
		r.elector.set(stateLeader)
		r.h = r.newHarvest(limits)
		r.runUntilEmpty()
		var got []int64
		for _, p := range r.kafka.published() {
			got = append(got, p.id)
		}
		if want := []int64{eleven, ten, eleven}; !slices.Equal(got, want) {
			t.Fatalf("published %v, want %v", got, want)
		}
	})
}

// A producer that has failed fatally says so on Produce too; that ends the epoch, and a new one
// publishes everything, rather than the record being retried for ever as if the producer were busy.
func TestFatalProduceErrorRemarks(t *testing.T) {
	r := newRig(t, fastLimits())
	r.kafka.delay = time.Millisecond
	ids := r.load(10, 10)
	r.kafka.produceFatal = true
	r.runUntilEmpty()
	r.checkOrder(ids)
	if n := countEvents[event.LeaderRefreshed](r.events); n != 1 {
		t.Errorf("%d remarks after a fatal produce error, want 1", n)
	}
	if n := countEvents[event.RecordFailed](r.events); n != 0 {
		t.Errorf("%d RecordFailed events: the producer's failure was blamed on a record", n)
	}
}

// misfitDB is an outbox whose table does not fit until fixed.
type misfitDB struct {
	*fakeDB
	mu    sync.Mutex
	fixed bool
}

func (d *misfitDB) CheckSchema(context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fixed {
		return nil
	}
	return &driver.SchemaError{Table: "outbox", Problems: []string{"column kafka_value has type xml"}}
}

// An elected leader whose table does not fit cannot publish, and readiness says so until the
// table is fixed.
func TestReadyReportsTableThatDoesNotFit(t *testing.T) {
	r := newRig(t, fastLimits())
	db := &misfitDB{fakeDB: r.db}
	r.h.cfg.OpenStore = func() (driver.DatabaseBinding, error) { return db, nil }
	ids := r.load(3, 3)
	r.start()
	r.waitFor("the mismatch to be reported", 5*time.Second, func() bool { return countEvents[event.SchemaRejected](r.events) > 0 })
	if err := r.h.Ready(context.Background()); err == nil || !strings.Contains(err.Error(), "kafka_value has type xml") {
		t.Fatalf("Ready = %v while the table does not fit", err)
	}
	db.mu.Lock()
	db.fixed = true
	db.mu.Unlock()
	r.waitEmpty(10 * time.Second)
	if err := r.h.Ready(context.Background()); err != nil {
		t.Fatalf("Ready = %v once the table fits", err)
	}
	r.stop()
	r.checkOrder(ids)
}

// failingNotePurge is an outbox whose schema check passes while every purge, and every read of
// the noted rows that a purge of them begins with, fails.
type failingNotePurge struct{ *fakeDB }

func (d failingNotePurge) CheckSchema(context.Context) error { return nil }

func (d failingNotePurge) Purge(context.Context, []int64) (int, error) { return 0, errDBDown }

func (d failingNotePurge) Reread(context.Context, []int64) ([]driver.RereadRecord, error) {
	return nil, errDBDown
}

// An epoch start whose schema check passes while the purge after it keeps failing is one lasting
// outage, not one that ends and begins again on every attempt: the log says so once (then at its
// interval), and readiness fails.
func TestEpochStartOutageLasts(t *testing.T) {
	r := newRig(t, fastLimits())
	db := failingNotePurge{r.db}
	r.h.cfg.OpenStore = func() (driver.DatabaseBinding, error) { return db, nil }
	r.kafka.broker.SetNote(rigNotes, epoch.EncodeNote([]epoch.Noted{{ID: 1 << 40}}))
	r.start()
	r.waitFor("several failed starts", 5*time.Second, func() bool {
		return testutil.ToFloat64(r.h.metrics.Errors.WithLabelValues(epoch.ErrorKindDatabase)) >= 5
	})
	if n := strings.Count(r.logs.String(), "database available again"); n != 0 {
		t.Errorf("the outage was said to end %d times while every start failed", n)
	}
	if err := r.h.Ready(context.Background()); err == nil {
		t.Error("ready while every epoch start fails")
	}
}

// slowDispose is an outbox whose connections take their time to close, as a pool's do on a
// server that does not answer.
type slowDispose struct {
	*fakeDB
	release chan struct{}
}

func (d slowDispose) Dispose() { <-d.release }

// Stop does not wait for the database's connections to close: on a server that does not answer
// that can take pgx 15 s, and a process that was told to stop must not.
func TestStopDoesNotWaitForTheDatabaseToClose(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		r := newRig(t, fastLimits())
		db := slowDispose{fakeDB: r.db, release: make(chan struct{})}
		defer close(db.release)
		r.h.cfg.OpenStore = func() (driver.DatabaseBinding, error) { return db, nil }
		r.start()
		r.waitFor("leadership", 5*time.Second, r.h.IsLeader)
		began := time.Now()
		r.stop()
		if took := time.Since(began); took > 3*r.h.cfg.Limits.HeartbeatTimeout {
			t.Errorf("Stop took %v while the database's connections were closing", took)
		}
		if !strings.Contains(r.logs.String(), "still closing at shutdown") {
			t.Error("the log does not say the connections are still closing")
		}
	})
}

// endEpochLeavingUnpurged runs the harvester over ids until some are published, then makes purges
// fail until records are committed and not purged, and revokes the leadership: the epoch ends with
// records it could not purge. Purges still fail afterwards.
func (r *rig) endEpochLeavingUnpurged(ids []int64) {
	r.t.Helper()
	r.start()
	r.waitFor("some progress", 10*time.Second, func() bool { return r.db.len() < len(ids)-40 })
	r.db.setFailPurges(true)
	r.waitFor("records committed and not purged", 10*time.Second, func() bool {
		return len(r.kafka.published()) > len(ids)-r.db.len()
	})
	r.elector.revoke()
	r.waitFor("the revoke", 5*time.Second, func() bool { return !r.h.IsLeader() && r.h.pulseAge() < 50*time.Millisecond })
}
