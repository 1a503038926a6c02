package bench_test

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/twmb/franz-go/pkg/kgo"

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

// floorTxnRecords is how many records a transaction of BenchmarkSustained/rate=2000 carries with
// the default commit cadence (its rec/txn: 2,000 records/s times 50 ms, less the transactions
// the load's unevenness ends early).
const floorTxnRecords = 100

// BenchmarkFloorTransactionalProducer: BenchmarkFloorIdempotentProducer's records at 2,000/s,
// sent in Kafka transactions as large as the relay's at that rate (floorTxnRecords): one writer
// hands the producer a batch of that many every 50 ms (the default commit cadence), which it
// sends in a transaction of its own and commits. No Postgres, no notes. Beside the idempotent
// floor, its relay-µs/rec and broker-µs/rec show what the transactions themselves cost; beside
// BenchmarkSustained/rate=2000, what the relay adds to them.
func BenchmarkFloorTransactionalProducer(b *testing.B) {
	b.Run("rate=2000", func(b *testing.B) { benchFloor(b, 2000, 1, floorTxnRecords, true) })
}

// benchFloor has writers hand batches of records straight to a producer of the benchmark's
// client at rate for 20 s, each batch in a transaction of its own when transactional.
func benchFloor(b *testing.B, rate float64, writers, batch int, transactional bool) {
	rig := startBenchRig(b)
	for range b.N {
		run := rig.newRun()
		send, closeProducer := floorProducer(b, rig.broker.Addr, transactional)
		c := run.startConsumer()
		w := run.writers(writers, batch, 1000, rate)
		w.send = send
		b.ResetTimer()
		m := rig.measure()
		<-w.runFor(20 * time.Second)
		m.stop(b, w.total())
		b.StopTimer()
		c.await(w)
		c.report(b, w)
		closeProducer()
		run.close()
	}
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
