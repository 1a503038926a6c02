package goharvest_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/kafkatest"
	"github.com/goharvest/goharvest/internal/pgtest"
	"github.com/goharvest/goharvest/stasher"
)

// intRig is a real outbox on Postgres and a real Kafka-protocol broker.
type intRig struct {
	t      *testing.T
	dsn    string
	pool   *pgxpool.Pool
	broker *kafkatest.Broker
	topic  string
}

func newIntRig(t *testing.T) *intRig {
	t.Helper()
	ctx := context.Background()
	r := &intRig{t: t, dsn: pgtest.NewDatabase(t), topic: "events"}
	if err := goharvest.CreateOutboxTable(ctx, r.dsn, "outbox"); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, r.dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	r.pool = pool
	r.broker = kafkatest.Start(t, kafkatest.WithTopics(8, r.topic))
	return r
}

// load stashes perKey records for each of keys keys. Each record's value is its sequence within
// its key; records are written in sequence order, so ids follow it.
func (r *intRig) load(keys, perKey int) {
	r.t.Helper()
	st, _ := stasher.New("outbox")
	var batch []goharvest.OutboxRecord
	flush := func() {
		if err := st.StashPgx(context.Background(), r.pool, batch...); err != nil {
			r.t.Fatal(err)
		}
		batch = batch[:0]
	}
	for seq := range perKey {
		for k := range keys {
			batch = append(batch, goharvest.OutboxRecord{
				KafkaTopic: r.topic, KafkaKey: fmt.Sprintf("key-%d", k), KafkaValue: goharvest.String(strconv.Itoa(seq)),
				KafkaHeaders: goharvest.KafkaHeaders{{Key: "seq", Value: strconv.Itoa(seq)}},
			})
			if len(batch) == 5000 {
				flush()
			}
		}
	}
	flush()
}

func (r *intRig) outboxRows() int {
	var n int
	if err := r.pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&n); err != nil {
		r.t.Fatal(err)
	}
	return n
}

func (r *intRig) harvester(events *eventRecorder) *goharvest.Harvest {
	r.t.Helper()
	h, err := goharvest.New(goharvest.Config{
		BaseKafkaConfig: goharvest.KafkaConfigMap{"bootstrap.servers": r.broker.Addr()},
		LeaderGroupID:   "harvest-int",
		LeaderTopic:     "harvest-int.leader",
		DataSource:      r.dsn,
		Limits: goharvest.Limits{
			HeartbeatTimeout: time.Second,
			MinPollInterval:  50 * time.Millisecond,
			IOErrorBackoff:   50 * time.Millisecond,
		},
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		r.t.Fatal(err)
	}
	if events != nil {
		h.SetEventHandler(events.record)
	}
	return h
}

func (r *intRig) waitEmpty(within time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for r.outboxRows() > 0 {
		if time.Now().After(deadline) {
			r.t.Fatalf("%d rows still in the outbox after %v", r.outboxRows(), within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runUntilDelivered runs h until the outbox is empty and v has seen every record, then stops it.
func (r *intRig) runUntilDelivered(h *goharvest.Harvest, v *verifier, keys, perKey int) {
	r.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	r.waitEmpty(3 * time.Minute)
	v.waitAll(r.t, keys, perKey, time.Minute)
	cancel()
	if err := <-done; err != nil {
		r.t.Fatal(err)
	}
}

type eventRecorder struct {
	mu     sync.Mutex
	counts map[string]int
}

func (e *eventRecorder) record(ev goharvest.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.counts == nil {
		e.counts = map[string]int{}
	}
	e.counts[fmt.Sprintf("%T", ev)]++
}

func (e *eventRecorder) count(kind string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.counts[kind]
}

// verifier consumes the topic from the start and checks what arrived.
type verifier struct {
	mu     sync.Mutex
	seqs   map[string][]int
	total  int
	cancel context.CancelFunc
	done   chan struct{}
}

func startVerifier(t *testing.T, r *intRig) *verifier {
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.broker.Addr()), kgo.ConsumeTopics(r.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	v := &verifier{seqs: map[string][]int{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(v.done)
		defer cl.Close()
		for ctx.Err() == nil {
			fetches := cl.PollFetches(ctx)
			fetches.EachRecord(func(rec *kgo.Record) {
				seq, err := strconv.Atoi(string(rec.Value))
				if err != nil {
					t.Errorf("unexpected value %q", rec.Value)
					return
				}
				if len(rec.Headers) != 1 || rec.Headers[0].Key != "seq" || string(rec.Headers[0].Value) != string(rec.Value) {
					t.Errorf("headers %v do not match value %q", rec.Headers, rec.Value)
				}
				v.mu.Lock()
				v.seqs[string(rec.Key)] = append(v.seqs[string(rec.Key)], seq)
				v.total++
				v.mu.Unlock()
			})
		}
	}()
	t.Cleanup(v.stop)
	return v
}

func (v *verifier) stop() {
	v.cancel()
	<-v.done
}

// waitAll waits until every one of keys*perKey records has arrived at least once.
func (v *verifier) waitAll(t *testing.T, keys, perKey int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		v.mu.Lock()
		distinct := 0
		for _, seqs := range v.seqs {
			seen := map[int]bool{}
			for _, s := range seqs {
				seen[s] = true
			}
			distinct += len(seen)
		}
		v.mu.Unlock()
		if distinct >= keys*perKey {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d records arrived within %v", distinct, keys*perKey, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// check asserts that every record arrived and that no key went backwards; a record repeated
// immediately is allowed. It returns the number of duplicates.
func (v *verifier) check(t *testing.T, keys, perKey int) (duplicates int) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	for k := range keys {
		key := fmt.Sprintf("key-%d", k)
		seqs := v.seqs[key]
		next := 0
		for i, s := range seqs {
			switch {
			case s == next:
				next++
			case s == next-1:
				duplicates++ // the record just published, again
			default:
				t.Errorf("key %s: got %d after %v; expected %d (or a repeat of %d)", key, s, seqs[max(0, i-3):i], next, next-1)
				return duplicates
			}
		}
		if next != perKey {
			t.Errorf("key %s: only records 0..%d of %d arrived", key, next-1, perKey)
		}
	}
	return duplicates
}

func TestHarvestDrainsFiftyThousandRecordsInOrder(t *testing.T) {
	const keys, perKey = 1000, 50
	r := newIntRig(t)
	r.load(keys, perKey)
	v := startVerifier(t, r)
	start := time.Now()
	r.runUntilDelivered(r.harvester(nil), v, keys, perKey)
	t.Logf("drained and verified %d records in %v", keys*perKey, time.Since(start))
	if dups := v.check(t, keys, perKey); dups != 0 {
		t.Errorf("%d duplicates in a run without faults", dups)
	}
}

func TestHarvestSurvivesFailedProduceRequests(t *testing.T) {
	const keys, perKey = 500, 40
	r := newIntRig(t)
	r.load(keys, perKey)
	v := startVerifier(t, r)
	// 1% of produce requests fail with an error the harvester sees (and must reset and remark),
	// and 1% time out after the broker stored the batch (librdkafka retries; idempotence must
	// drop the copy).
	visible := r.broker.FailProduce(100, kerr.UnknownServerError)
	timedOut := r.broker.FailProduce(100, kerr.RequestTimedOut)
	events := &eventRecorder{}
	r.runUntilDelivered(r.harvester(events), v, keys, perKey)
	dups := v.check(t, keys, perKey)
	t.Logf("faults: %d visible, %d timed out; remarks: %d; duplicates: %d",
		visible.Hits(), timedOut.Hits(), events.count("goharvest.LeaderRefreshed"), dups)
	if visible.Hits() == 0 || timedOut.Hits() == 0 {
		t.Fatal("the faults were never injected")
	}
	if events.count("goharvest.LeaderRefreshed") == 0 {
		t.Fatal("failed deliveries caused no remark")
	}
}

func TestHarvestStopMidRunThenStartAgain(t *testing.T) {
	const keys, perKey = 500, 40
	r := newIntRig(t)
	r.load(keys, perKey)
	v := startVerifier(t, r)

	first := r.harvester(nil)
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	for r.outboxRows() > keys*perKey*2/3 {
		time.Sleep(5 * time.Millisecond)
	}
	first.Stop()
	if err := first.Await(); err != nil {
		t.Fatal(err)
	}
	left := r.outboxRows()
	if left == 0 {
		t.Fatal("the first harvester finished before it was stopped")
	}
	t.Logf("stopped with %d rows left", left)

	r.runUntilDelivered(r.harvester(nil), v, keys, perKey)
	t.Logf("duplicates: %d", v.check(t, keys, perKey))
}
