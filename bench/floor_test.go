package bench_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

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
		b.Run("rate="+strconv.Itoa(int(rate)), func(b *testing.B) {
			rig := startBenchRig(b)
			for range b.N {
				run := rig.newRun()
				send, closeProducer := floorProducer(b, rig.broker.Addr)
				c := run.startConsumer()
				w := run.writers(8, 10, 1000, rate)
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
		})
	}
}

// floorProducers make the floor's producer for each client that GOHARVEST_BENCH_CLIENT names
// (librdkafka's, in a file built with cgo).
var floorProducers = map[string]func(b *testing.B, addr string) (send func(context.Context, []outboxpkg.Record) error, close func()){
	"franz": franzFloorProducer,
}

func floorProducer(b *testing.B, addr string) (func(context.Context, []outboxpkg.Record) error, func()) {
	client := os.Getenv(EnvBenchClient)
	if client == "" {
		client = "franz"
	}
	newProducer, ok := floorProducers[client]
	if !ok {
		b.Fatalf("no floor producer for client %q in this build", client)
	}
	return newProducer(b, addr)
}

// franzFloorProducer is kgo's default producer: idempotent, acks=all.
func franzFloorProducer(b *testing.B, addr string) (func(context.Context, []outboxpkg.Record) error, func()) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(addr, ",")...), kgo.ProducerLinger(0))
	if err != nil {
		b.Fatal(err)
	}
	send := func(ctx context.Context, records []outboxpkg.Record) error {
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
	return send, cl.Close
}
