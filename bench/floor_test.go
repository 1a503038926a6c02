package bench_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/wakegrid"
	outboxpkg "github.com/goharvest/goharvest/outbox"
)

// BenchmarkFloorIdempotentProducer: the floor a relay is measured against. The writers of
// BenchmarkSustained (8 of them, 10 records a batch, 1,000 keys, the same values and headers) hand
// their records straight to an idempotent producer of the benchmark's client (acks=all, no
// transactions, no Postgres) at 2,000 and 5,000 records/s for 20 s. Its broker-µs/rec is what
// Kafka spends on the records themselves; the difference to BenchmarkSustained's at the same rate
// is what the relay's transactions and notes cost the broker. Its p50-ms and p99-ms run from the
// hand-over to arrival at a read_committed consumer.
func BenchmarkFloorIdempotentProducer(b *testing.B) {
	for _, rate := range []float64{2000, 5000} {
		b.Run("rate="+strconv.Itoa(int(rate)), func(b *testing.B) { benchFloor(b, rate, 8, 10, false) })
	}
}

// BenchmarkFloorTransactionalProducer: BenchmarkFloorIdempotentProducer's writers and records at
// 2,000/s, sent in Kafka transactions as the relay's commit cadence gathers them: the writers' hand
// over only queues their records, and a loop sends what has queued at each point of a grid of the
// default commit cadence (50 ms) in one transaction of the benchmark's client, which it commits
// while the next records queue up. No Postgres, no notes. Its rec/txn is the relay's at that rate
// (about 100); beside the idempotent floor, its relay-µs/rec and broker-µs/rec show what the
// transactions themselves cost; beside BenchmarkCycleStatements (BenchmarkSustained at 2,000/s),
// what the relay adds to them.
func BenchmarkFloorTransactionalProducer(b *testing.B) {
	b.Run("rate=2000", func(b *testing.B) { benchFloor(b, 2000, 8, 10, true) })
}

// BenchmarkWarmBroker: the light-load figures on a broker that has run for minutes, as a
// production broker has. A JVM compiles its hot code in its first minutes (broker-jit-µs/rec is
// the compiler's part of broker-µs/rec), and runs faster once it has, while every other benchmark
// measures a broker of its own a minute or two old. This one first runs BenchmarkSustained at
// 2,000/s four times ("warm-up", about 100 s), then on the same broker and Postgres server the
// idempotent floor, the floor in transactions and the relay at 2,000/s, and the relay at 800/s on
// 8 shards; then the same again in the reverse order, so that warming still under way shows as a
// difference between the two passes.
func BenchmarkWarmBroker(b *testing.B) {
	rig := startBenchRig(b)
	for i := range 4 {
		b.Run("warm-up/round="+strconv.Itoa(i), func(b *testing.B) {
			rig.b = b
			rig.sustained(2000, goharvest.DefaultClaimStrategy, 0, 1)
		})
	}
	cases := []struct {
		name string
		run  func()
	}{
		{"floor/rate=2000", func() { rig.floor(2000, 8, 10, false) }},
		{"floor-transactions/rate=2000", func() { rig.floor(2000, 8, 10, true) }},
		{"relay/rate=2000", func() { rig.sustained(2000, goharvest.DefaultClaimStrategy, 0, 1) }},
		{"relay/rate=800/shards=8", func() { rig.sustained(800, goharvest.DefaultClaimStrategy, 0, 8) }},
	}
	for pass := 1; pass <= 2; pass++ {
		for i := range cases {
			c := cases[i]
			if pass == 2 {
				c = cases[len(cases)-1-i]
			}
			b.Run(c.name+"/pass="+strconv.Itoa(pass), func(b *testing.B) {
				rig.b = b
				c.run()
			})
		}
	}
}

// benchFloor has writers hand batches of records straight to a producer of the benchmark's
// client at rate for 20 s; transactional, in one transaction per commit cadence (cadenceBatches).
func benchFloor(b *testing.B, rate float64, writers, batch int, transactional bool) {
	startBenchRig(b).floor(rate, writers, batch, transactional)
}

// floor is benchFloor on a rig already started.
func (rig *benchRig) floor(rate float64, writers, batch int, transactional bool) {
	b := rig.b
	for range b.N {
		run := rig.newRun()
		send, closeProducer := floorProducer(b, rig.broker.Addr, transactional)
		var batches *cadenceBatches
		if transactional {
			batches = startCadenceBatches(b, send)
			send, rig.commits = batches.queue, batches.txns
		}
		c := run.startConsumer()
		w := run.writers(writers, batch, 1000, rate)
		w.send = send
		b.ResetTimer()
		m := rig.measure()
		<-w.runFor(20 * time.Second)
		if batches != nil {
			batches.stop() // the last records' transaction, before the measurement ends
		}
		m.stop(b, w.total())
		b.StopTimer()
		rig.commits = nil
		c.await(w)
		c.report(b, w)
		closeProducer()
		run.close()
	}
}

// cadenceBatches sends the records handed to it in one transaction per point of a grid of the
// default commit cadence, as the relay gathers its records at light load: a slow commit makes the
// next transaction larger rather than holding the writers up.
type cadenceBatches struct {
	b    *testing.B
	send func(context.Context, []outboxpkg.Record) error // one transaction

	mu        sync.Mutex
	pending   []outboxpkg.Record
	committed int // transactions

	done, stopped chan struct{}
	stopOnce      sync.Once
}

func startCadenceBatches(b *testing.B, send func(context.Context, []outboxpkg.Record) error) *cadenceBatches {
	c := &cadenceBatches{b: b, send: send, done: make(chan struct{}), stopped: make(chan struct{})}
	cadence := goharvest.Limits{}.WithDefaults().CommitCadence
	go func() {
		defer close(c.stopped)
		for {
			select {
			case <-c.done:
				c.flush()
				return
			case <-time.After(time.Until(wakegrid.Next(time.Now(), cadence))):
				c.flush()
			}
		}
	}()
	b.Cleanup(c.stop)
	return c
}

// queue takes records for the next transaction; the writers' clock starts here, as a relay's
// starts at the writer's commit.
func (c *cadenceBatches) queue(_ context.Context, records []outboxpkg.Record) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pending = append(c.pending, records...)
	return nil
}

// flush sends what has queued in one transaction.
func (c *cadenceBatches) flush() {
	c.mu.Lock()
	batch := c.pending
	c.pending = nil
	c.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	if err := c.send(context.Background(), batch); err != nil {
		c.b.Error(err)
		return
	}
	c.mu.Lock()
	c.committed++
	c.mu.Unlock()
}

// txns counts the transactions committed so far.
func (c *cadenceBatches) txns() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return float64(c.committed)
}

// stop sends what is left and ends the loop.
func (c *cadenceBatches) stop() {
	c.stopOnce.Do(func() { close(c.done) })
	<-c.stopped
}

// floorProducers make the floor's producer for each client that GOHARVEST_BENCH_CLIENT names
// (librdkafka's, in a file built with cgo).
// With transactional, each call of send is a transaction of its own.
var floorProducers = map[string]func(b *testing.B, addr string, transactional bool) (send func(context.Context, []outboxpkg.Record) error, close func()){
	"franz": franzFloorProducer,
}

func floorProducer(b *testing.B, addr string, transactional bool) (func(context.Context, []outboxpkg.Record) error, func()) {
	client := os.Getenv(EnvBenchClient)
	if client == "" {
		client = "franz"
	}
	newProducer, ok := floorProducers[client]
	if !ok {
		b.Fatalf("no floor producer for client %q in this build", client)
	}
	return newProducer(b, addr, transactional)
}

// franzFloorProducer is kgo's default producer: idempotent, acks=all; transactional, with a
// transactional ID of its own.
func franzFloorProducer(b *testing.B, addr string, transactional bool) (func(context.Context, []outboxpkg.Record) error, func()) {
	opts := []kgo.Opt{kgo.SeedBrokers(strings.Split(addr, ",")...), kgo.ProducerLinger(0)}
	if transactional {
		opts = append(opts, kgo.TransactionalID("bench-floor-"+uuid.NewString()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		b.Fatal(err)
	}
	produce := func(ctx context.Context, records []outboxpkg.Record) error {
		recs := make([]*kgo.Record, len(records))
		for i, r := range records {
			rec := &kgo.Record{Topic: r.KafkaTopic, Key: []byte(r.KafkaKey)}
			if r.KafkaValue != nil {
				rec.Value = []byte(*r.KafkaValue)
			}
			for _, h := range r.KafkaHeaders {
				rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)})
			}
			recs[i] = rec
		}
		return cl.ProduceSync(ctx, recs...).FirstErr()
	}
	if !transactional {
		return produce, cl.Close
	}
	end := func(ctx context.Context, commit bool) error {
		return cl.EndTransaction(ctx, kgo.TransactionEndTry(commit))
	}
	return transactionally(produce, cl.BeginTransaction, end), cl.Close
}

// transactionally makes each call of produce a transaction of its own, which it commits, or
// aborts when produce fails.
func transactionally(produce func(context.Context, []outboxpkg.Record) error, begin func() error,
	end func(ctx context.Context, commit bool) error) func(context.Context, []outboxpkg.Record) error {
	return func(ctx context.Context, records []outboxpkg.Record) error {
		if err := begin(); err != nil {
			return err
		}
		if err := produce(ctx, records); err != nil {
			return errors.Join(err, end(ctx, false))
		}
		return end(ctx, true)
	}
}
