package epoch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/memory"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/outage"
	"github.com/goharvest/goharvest/internal/wakegrid"
	"github.com/goharvest/goharvest/metric"
)

// The commit cadence's tests run an epoch on the in-memory outbox and broker inside a synctest
// bubble, where time is virtual: a wait of the cadence takes no real time, and a commit's time
// is exact, so "at the cadence, not later" and "at once, not after the cadence" are checked to
// the millisecond.

// cadenceRig is an epoch publishing from an in-memory outbox to an in-memory broker, whose
// producer notes when each transaction commits and what it carries.
type cadenceRig struct {
	t     *testing.T
	store *claimCounter
	p     *Epoch
	prod  *commitClock

	mu       sync.Mutex
	inserted map[string]time.Time // when each record (by key) was written
}

// claimCounter is the in-memory outbox, counting the marks the epoch claims its rows with.
type claimCounter struct {
	*memory.Store
	claims atomic.Int64
}

func (c *claimCounter) MarkExcept(ctx context.Context, leaderID uuid.UUID, limit int, heldKeys []string) ([]driver.MarkedRecord, error) {
	c.claims.Add(1)
	return c.Store.MarkExcept(ctx, leaderID, limit, heldKeys)
}

// commitClock is a producer that notes each commit's time and how many messages it carried.
type commitClock struct {
	*memory.Producer
	broker *memory.Broker

	mu      sync.Mutex
	commits []commitAt
	seen    int // messages of earlier commits
}

type commitAt struct {
	at   time.Time
	keys []string
}

func (c *commitClock) CommitTransaction(ctx context.Context) error {
	err := c.Producer.CommitTransaction(ctx)
	if err == nil {
		msgs := c.broker.Committed()
		c.mu.Lock()
		var keys []string
		for _, m := range msgs[c.seen:] {
			keys = append(keys, string(m.Key))
		}
		c.seen = len(msgs)
		c.commits = append(c.commits, commitAt{at: time.Now(), keys: keys})
		c.mu.Unlock()
	}
	return err
}

func (c *commitClock) list() []commitAt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]commitAt(nil), c.commits...)
}

// cadenceLimits marks every millisecond while the outbox is empty, so that a record is claimed
// within a millisecond of its write, and commits at the given cadence.
func cadenceLimits(cadence time.Duration) Limits {
	return Limits{CommitCadence: cadence, MarkBackoff: time.Millisecond, MaxMarkBackoff: time.Millisecond,
		HeartbeatTimeout: time.Second}.WithDefaults()
}

// startCadenceRig starts an epoch inside the calling synctest bubble; leading says whether it
// may still publish.
func startCadenceRig(t *testing.T, limits Limits, leading func() bool) *cadenceRig {
	return startCadenceRigWith(t, limits, leading, nil)
}

// startCadenceRigWith is startCadenceRig with the outbox holding what preload writes before the
// epoch starts.
func startCadenceRigWith(t *testing.T, limits Limits, leading func() bool, preload func(*memory.Store)) *cadenceRig {
	store := &claimCounter{Store: memory.NewStore()}
	if preload != nil {
		preload(store.Store)
	}
	return startEpochOn(t, limits, leading, store, driver.Features{})
}

// startEpochOn starts the rig's epoch on store, with features (a listener's, say).
func startEpochOn(t *testing.T, limits Limits, leading func() bool, store *claimCounter, features driver.Features) *cadenceRig {
	broker := memory.NewBroker()
	prod := &commitClock{Producer: broker.NewProducer("cadence"), broker: broker}
	if err := prod.InitTransactions(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := prod.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	p := Start(Deps{
		LeaderID: uuid.New(), Limits: limits, Store: store, Features: features, Producer: prod,
		Log: slog.New(slog.DiscardHandler), Emit: func(event.Event) {}, Meter: metric.NewMeter("t", time.Hour),
		DBTrouble: &outage.Logger{What: "database"}, Notify: &outage.Logger{What: "notifications"}, Metrics: NewMetrics("t", nil, nil),
		Leading: leading, BusyEpochs: new(atomic.Int32), Failures: &Failures{},
		Notes: driver.NotePlace{Group: "notes", Topic: "leader"},
	})
	return &cadenceRig{t: t, store: store, p: p, prod: prod, inserted: map[string]time.Time{}}
}

// write adds a record of key to the outbox, noting when.
func (r *cadenceRig) write(key string) {
	r.mu.Lock()
	r.inserted[key] = time.Now()
	r.mu.Unlock()
	v := "v"
	r.store.Insert(driver.OutboxRecord{KafkaTopic: "topic", KafkaKey: key, KafkaValue: &v})
}

// stop ends the epoch as its owner does, waits until its producer is closed, and returns how long
// Stop took.
func (r *cadenceRig) stop() time.Duration {
	began := time.Now()
	_, closed := r.p.Stop(r.p.Limits.MaxPollInterval)
	took := time.Since(began)
	<-closed
	return took
}

// committed returns how many records have been committed.
func (r *cadenceRig) committed() int {
	n := 0
	for _, c := range r.prod.list() {
		n += len(c.keys)
	}
	return n
}

// latencies returns, for every committed record, the time from its write to its commit.
func (r *cadenceRig) latencies() []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []time.Duration
	for _, c := range r.prod.list() {
		for _, k := range c.keys {
			out = append(out, c.at.Sub(r.inserted[k]))
		}
	}
	return out
}

// advanceTo moves the bubble's virtual clock to at, letting every goroutine of the bubble run
// whatever falls due before it, and returns at. The tests name each instant they look at.
func advanceTo(at time.Time) time.Time {
	time.Sleep(time.Until(at))
	return at
}

// nextGridPoint advances the bubble's clock to the next point of the cadence's grid.
func nextGridPoint(cadence time.Duration) time.Time {
	return advanceTo(wakegrid.Next(time.Now(), cadence))
}

// writePaced writes records of the keys key(0)..key(n-1), one every interval, and returns when
// the last was written.
func (r *cadenceRig) writePaced(n int, interval time.Duration, key func(int) string) time.Time {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := range n {
		if i > 0 {
			<-tick.C
		}
		r.write(key(i))
	}
	return time.Now()
}

// A lone record, with nothing written after it, is committed at the next point of the cadence's
// grid: never later than CommitCadence after its write, and not before that point. Written just
// after a point it waits a whole cadence; written later, the rest of one.
func TestCommitCadenceLoneRecord(t *testing.T) {
	const cadence = 50 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		r := startCadenceRig(t, cadenceLimits(cadence), func() bool { return true })
		defer r.stop()
		synctest.Wait() // the marker has found the outbox empty and waits to look again
		for i, offset := range []time.Duration{0, time.Millisecond, 17 * time.Millisecond, 48 * time.Millisecond} {
			written := advanceTo(nextGridPoint(cadence).Add(offset))
			r.write(fmt.Sprint("lone", i))
			advanceTo(written.Add(3 * cadence)) // nothing else arrives
			commits := r.prod.list()
			if len(commits) != i+1 || len(commits[i].keys) != 1 {
				t.Fatalf("written %v after a point of the grid: commits %v, want one more, of the lone record", offset, commits)
			}
			held, want := commits[i].at.Sub(written), cadence-offset
			if held > cadence+time.Millisecond {
				t.Errorf("written %v after a point of the grid, the lone record was committed %v after its write; the cadence is %v", offset, held, cadence)
			}
			// The marker looks every millisecond, so the record may miss the point by that much.
			if held < want-time.Millisecond || held > want+time.Millisecond {
				t.Errorf("written %v after a point of the grid, the lone record was committed %v after its write, want the next point, %v later", offset, held, want)
			}
		}
	})
}

// Under a steady trickle (a record every 2ms, each of a key of its own, so that any may join any
// transaction) a transaction carries about a cadence's worth of records, claimed once a cadence,
// and no record waits longer than a cadence and a quarter for its commit (the marker claims in
// each cadence's last quarter). Committing as soon as nothing more can join would commit each
// record alone; claiming whenever the marker's backoff (1ms here) ends would claim each alone.
func TestCommitCadenceSteadyStream(t *testing.T) {
	const cadence = 50 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		r := startCadenceRig(t, cadenceLimits(cadence), func() bool { return true })
		defer r.stop()
		synctest.Wait()
		const records = 500
		claimsBefore := r.store.claims.Load()
		first := time.Now()
		last := r.writePaced(records, 2*time.Millisecond, func(i int) string { return fmt.Sprint("k", i) })
		claims := r.store.claims.Load() - claimsBefore
		t.Logf("%d claims in the %v of writes", claims, last.Sub(first))
		if cadences := int64(last.Sub(first)/cadence) + 1; claims > cadences+2 {
			t.Errorf("%d claims in %d cadences of writes; want one a cadence", claims, cadences)
		}
		advanceTo(last.Add(2 * cadence))
		commits := r.prod.list()
		lat := r.latencies()
		if len(lat) != records {
			t.Fatalf("%d of %d records committed", len(lat), records)
		}
		t.Logf("%d records in %d transactions", records, len(commits))
		// 1s of writes at a cadence of 50ms: about 20 transactions of 25 records.
		if perTxn := float64(records) / float64(len(commits)); perTxn < 20 {
			t.Errorf("%d transactions, %.1f records each: the cadence did not gather the stream", len(commits), perTxn)
		}
		for i, l := range lat {
			if l > cadence+cadence/4+time.Millisecond {
				t.Fatalf("record %d committed %v after its write; the cadence is %v", i, l, cadence)
			}
		}
	})
}

// A key written faster than the cadence (MaxKeyRun 1: one record of it per transaction) is not
// held to a record per cadence: once its records have waited two cadences they commit one after
// another at once, as without a cadence, and the key keeps up.
func TestCommitCadenceHotKeyKeepsUp(t *testing.T) {
	const cadence = 50 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		r := startCadenceRig(t, cadenceLimits(cadence), func() bool { return true })
		defer r.stop()
		synctest.Wait()
		const records = 200 // one every 5ms: 10 a cadence
		last := r.writePaced(records, 5*time.Millisecond, func(int) string { return "hot" })
		advanceTo(last.Add(4 * cadence))
		committed := r.committed()
		t.Logf("%d transactions", len(r.prod.list()))
		if committed != records {
			t.Fatalf("%d of %d records of the hot key committed 200ms after the last write: it fell behind", committed, records)
		}
	})
}

// Under a backlog the cadence adds no wait: with a cadence of a second, 2,000 preloaded records
// are published in a fraction of it, all but the last claim's transaction committing as soon as
// they cannot grow, as without a cadence.
func TestCommitCadenceAddsNoWaitUnderLoad(t *testing.T) {
	const cadence = time.Second
	synctest.Test(t, func(t *testing.T) {
		limits := cadenceLimits(cadence)
		limits.MarkQueryRecords = 100
		limits.MaxInFlightRecords = 300
		// Written before the epoch starts: written while it runs, a claim could catch the burst
		// part written, and the next claim would then wait for the cadence's window (a trickle's).
		const records = 2000
		v := "v"
		r := startCadenceRigWith(t, limits, func() bool { return true }, func(s *memory.Store) {
			for i := range records {
				s.Insert(driver.OutboxRecord{KafkaTopic: "topic", KafkaKey: fmt.Sprint("k", i%500), KafkaValue: &v})
			}
		})
		defer r.stop()
		began := time.Now()
		advanceTo(began.Add(cadence / 4))
		committed := r.committed()
		t.Logf("%d of %d committed after %v, in %d transactions", committed, records, time.Since(began), len(r.prod.list()))
		if committed < records-limits.MaxInFlightRecords {
			t.Errorf("%d of %d backlogged records committed %v after they were written: the cadence held up a backlog", committed, records, time.Since(began))
		}
	})
}

// Stop during a cadence's wait ends it at once: the waiting transaction is committed and Stop
// returns without waiting out the cadence. The owner ends an epoch so when Stop is called or
// leadership is revoked, after which the epoch is told it no longer leads (Leading).
func TestCommitCadenceStopEndsTheWait(t *testing.T) {
	const cadence = time.Second
	for _, revoked := range []bool{false, true} {
		t.Run(fmt.Sprint("revoked=", revoked), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var leading atomic.Bool
				leading.Store(true)
				r := startCadenceRig(t, cadenceLimits(cadence), leading.Load)
				synctest.Wait()
				written := nextGridPoint(cadence)
				r.write("waiting")
				advanceTo(written.Add(100 * time.Millisecond))
				if n := len(r.prod.list()); n != 0 {
					t.Errorf("%d commits before the cadence", n)
				}
				if revoked {
					leading.Store(false)
					r.write("after the revoke")
					advanceTo(written.Add(110 * time.Millisecond)) // the marker has looked ten times since
				}
				began := time.Now()
				took := r.stop()
				if took > time.Millisecond {
					t.Errorf("Stop took %v during a cadence of %v", took, cadence)
				}
				commits := r.prod.list()
				if len(commits) != 1 || len(commits[0].keys) != 1 || commits[0].keys[0] != "waiting" {
					t.Fatalf("commits %v: want the waiting record's, at once", commits)
				}
				if at := commits[0].at.Sub(began); at > time.Millisecond {
					t.Errorf("the waiting record was committed %v after Stop began", at)
				}
			})
		})
	}
}

// notifyingStore is the in-memory outbox with notifications that cover every write, as the
// Postgres store's trigger gives: each write wakes the marker, and so does notify, which stands
// for another shard's write (a notification does not say whose rows were written).
type notifyingStore struct {
	*claimCounter
	notes chan struct{}
}

func (s *notifyingStore) Listen(ctx context.Context, wake func()) error {
	return s.ListenCovering(ctx, wake, func(bool) {})
}

func (s *notifyingStore) ListenCovering(ctx context.Context, wake func(), covered func(bool)) error {
	covered(true)
	defer covered(false)
	wake()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-s.notes:
			wake()
		}
	}
}

func (s *notifyingStore) notify() {
	select {
	case s.notes <- struct{}{}:
	default:
	}
}

// One of 8 shards at light load: notifications arrive on every writer's commit, one every 2ms,
// and only one in 50 brings a row of this shard. The marker must claim about once a cadence, not
// once a notification (each claim finding nothing), and still commit each of its rows within a
// cadence and a quarter of its write.
func TestCommitCadenceOtherShardsNotifications(t *testing.T) {
	const cadence = 50 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		store := &notifyingStore{claimCounter: &claimCounter{Store: memory.NewStore()}, notes: make(chan struct{}, 1)}
		r := startEpochOn(t, cadenceLimits(cadence), func() bool { return true }, store.claimCounter, driver.FeaturesOf(store))
		defer r.stop()
		synctest.Wait()
		const notifications, mine = 500, 10
		claimsBefore := r.store.claims.Load()
		first := time.Now()
		tick := time.NewTicker(2 * time.Millisecond)
		for i := range notifications {
			if i > 0 {
				<-tick.C
			}
			if i%(notifications/mine) == 0 {
				r.write(fmt.Sprint("k", i))
			}
			store.notify()
		}
		tick.Stop()
		last := time.Now()
		claims := r.store.claims.Load() - claimsBefore
		t.Logf("%d claims in the %v of %d notifications", claims, last.Sub(first), notifications)
		if cadences := int64(last.Sub(first)/cadence) + 1; claims > cadences+2 {
			t.Errorf("%d claims in %d cadences of notifications; want one a cadence", claims, cadences)
		}
		advanceTo(last.Add(2 * cadence))
		lat := r.latencies()
		if len(lat) != mine {
			t.Fatalf("%d of %d records committed", len(lat), mine)
		}
		for i, l := range lat {
			if l > cadence+cadence/4+time.Millisecond {
				t.Fatalf("record %d committed %v after its write; the cadence is %v", i, l, cadence)
			}
		}
	})
}
