package embed_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/driver/librdkafka"
	"github.com/goharvest/goharvest/internal/engine/epoch"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
	"github.com/goharvest/goharvest/stasher"
)

// These tests hold the librdkafka producer (package driver/librdkafka) to what the harvester
// relies on, on Apache Kafka: the broker answers where kfake only imitated it.

// producerFor returns a transactional producer of the ID txnID on the shared cluster, its
// transactions initialised, closed when the test ends.
func producerFor(t *testing.T, txnID string) driver.KafkaProducer {
	t.Helper()
	p, err := librdkafka.New(librdkafka.Config{Properties: map[string]any{
		"bootstrap.servers": kafkacluster.Shared(t).Addr(),
	}}).NewProducer(driver.ProducerConfig{
		TransactionalID: txnID, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			p.Abandon()
			go func() {
				for range p.Deliveries() {
				}
			}()
			p.Close()
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := p.InitTransactions(ctx); err != nil {
		t.Fatal(err)
	}
	return p
}

// produceOne queues one message, retrying while the topic's metadata is looked up.
func produceOne(t *testing.T, p driver.KafkaProducer, topic, value string) {
	t.Helper()
	if err := kafkatest.Produce(p, driver.Message{Topic: topic, Key: []byte("k"), Value: []byte(value)}, 30*time.Second); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// A new epoch reads the note right after its InitTransactions. On Apache Kafka, EndTxn returns
// once the commit is prepared and the markers (the note's among them) are written after; the note
// read must nonetheless be the latest committed one, never an error or an older note, whether the
// last transaction committed or was left open for the new producer to abort.
func TestNoteReadRightAfterInitTransactionsIsSettled(t *testing.T) {
	c := kafkacluster.Shared(t)
	id := fmt.Sprintf("note-settled-%d", time.Now().UnixNano())
	topic := c.Topic(t, id, 1)
	place := driver.NotePlace{Group: id + ".notes", Topic: topic, Partition: 0}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	want := ""
	for round := range 10 {
		p := producerFor(t, id)
		got, err := p.ReadNote(ctx, place)
		if err != nil {
			t.Fatalf("round %d: read the note right after InitTransactions: %v", round, err)
		}
		if got != want {
			t.Fatalf("round %d: read note %q, want %q (the latest committed)", round, got, want)
		}
		if err := p.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		produceOne(t, p, topic, fmt.Sprint(round))
		note := epoch.EncodeNote([]epoch.Noted{{ID: int64(round) + 1}})
		if err := p.WriteNote(ctx, place, note); err != nil {
			t.Fatalf("round %d: write note: %v", round, err)
		}
		if round%2 == 0 {
			if err := p.CommitTransaction(ctx); err != nil {
				t.Fatalf("round %d: commit: %v", round, err)
			}
			want = note
		} // odd rounds leave the transaction open: the next producer's InitTransactions aborts it
	}
}

// The fullest note the harvester writes (MaxNotedRecords widely spread ids) fits the offset
// metadata a broker with default settings accepts (offset.metadata.max.bytes, 4096), and reads
// back whole.
func TestFullNoteCommitsOnApacheKafka(t *testing.T) {
	c := kafkacluster.Shared(t)
	id := fmt.Sprintf("note-full-%d", time.Now().UnixNano())
	topic := c.Topic(t, id, 1)
	place := driver.NotePlace{Group: id + ".notes", Topic: topic, Partition: 0}
	records := make([]epoch.Noted, epoch.MaxNotedRecords)
	for i := range records {
		records[i] = epoch.Noted{ID: math.MaxInt64 / epoch.MaxNotedRecords * int64(i+1), Fingerprint: math.MaxUint32}
	}
	note := epoch.EncodeNote(records)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := producerFor(t, id)
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produceOne(t, p, topic, "v")
	if err := p.WriteNote(ctx, place, note); err != nil {
		t.Fatalf("write a note of %d bytes: %v", len(note), err)
	}
	if err := p.CommitTransaction(ctx); err != nil {
		t.Fatalf("commit a note of %d bytes: %v", len(note), err)
	}
	got, err := producerFor(t, id).ReadNote(ctx, place)
	if err != nil || got != note {
		t.Fatalf("read back %d bytes (%v), want the %d written", len(got), err, len(note))
	}
}

// A producer fenced by a newer one with its transactional ID (a new epoch, in this process or
// another) learns it from the broker: Apache Kafka answers its requests INVALID_PRODUCER_EPOCH or
// PRODUCER_FENCED, and its commit must fail as fatal (the epoch ends) with nothing it sent
// visible to read_committed consumers. When a request of its own was answered between the fence
// and its next produce (its first record's, sent late on a busy machine), that produce fails as
// fatal already, which ends the epoch as well.
func TestFencedProducerCannotCommit(t *testing.T) {
	c := kafkacluster.Shared(t)
	id := fmt.Sprintf("fenced-%d", time.Now().UnixNano())
	topic := c.Topic(t, id, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	old := producerFor(t, id)
	if err := old.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	produceOne(t, old, topic, "before the fence")
	_ = producerFor(t, id) // fences old
	err := old.Produce(driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("after the fence")})
	what := "produce"
	if err == nil {
		what, err = "commit", old.CommitTransaction(ctx)
	}
	var txnErr *driver.TxnError
	if !errors.As(err, &txnErr) || !txnErr.Fatal {
		t.Fatalf("the fenced producer's %s returned %v, want a fatal TxnError", what, err)
	}
	t.Logf("fenced producer's %s: %v", what, err)
	if values := consumeValues(t, c.Addr(), topic, 0); len(values) != 0 {
		t.Fatalf("read_committed consumer saw %q from a fenced producer", values)
	}
}

// BenchmarkTransactionCycle times one transaction of one record with its note (begin, produce,
// note, delivery, commit) back to back, as a harvester's epoch under light load commits them,
// with each Kafka client, on Apache Kafka and on kfake; it reports the mean and the median and
// 99th percentile of one cycle. On Kafka, a transaction's markers are written after its commit
// returns, and the next transaction waits for them. librdkafka speaks the first transaction
// protocol: its AddPartitionsToTxn and its note's AddOffsetsToTxn are answered
// CONCURRENT_TRANSACTIONS until the markers are written, and it asks again after 20ms and after
// retry.backoff.ms (librdkafka.DefaultRetryBackoff). The franz client speaks the second (KIP-890
// part 2): the broker itself holds the first produce until the markers are written, asking
// itself again every add.partitions.to.txn.retry.backoff.ms (20ms by default, 1ms on
// kafka-retry1ms, a broker setting), and the note is asked again after 2ms. On kafka-tv1, Apache Kafka formatted with transaction.version 1 (as a
// cluster upgraded from 3.x runs), franz speaks the first protocol too, and asks again after
// kgo's 20ms.
func BenchmarkTransactionCycle(b *testing.B) {
	clients := map[string]func(addr string) driver.Kafka{
		"librdkafka": func(addr string) driver.Kafka {
			return librdkafka.New(librdkafka.Config{Properties: map[string]any{"bootstrap.servers": addr}})
		},
		"franz": func(addr string) driver.Kafka { return franz.New(franz.Config{SeedBrokers: []string{addr}}) },
	}
	var tv1, fast *kafkacluster.Cluster // started by their first run, for both clients
	b.Cleanup(func() {
		for _, c := range []*kafkacluster.Cluster{tv1, fast} {
			if c != nil {
				c.Close(b.Failed())
			}
		}
	})
	for _, broker := range []string{"kafka", "kafka-retry1ms", "kafka-tv1", "kfake"} {
		for _, client := range []string{"librdkafka", "franz"} {
			b.Run(broker+"/"+client, func(b *testing.B) {
				var addr string
				switch broker {
				case "kafka":
					addr = kafkacluster.Shared(b).Addr()
				case "kafka-retry1ms":
					if fast == nil {
						var err error
						if fast, err = kafkacluster.New(kafkacluster.BrokerConfig(map[string]string{
							"add.partitions.to.txn.retry.backoff.ms": "1"})); err != nil {
							b.Fatal(err)
						}
					}
					addr = fast.Addr()
				case "kafka-tv1":
					if tv1 == nil {
						var err error
						if tv1, err = kafkacluster.New(kafkacluster.Feature("transaction.version", 1)); err != nil {
							b.Fatal(err)
						}
					}
					addr = tv1.Addr()
				default:
					addr = kafkatest.Start(b).Addr()
				}
				benchTransactionCycle(b, clients[client](addr), fmt.Sprintf("cycle-%s-%s-%d", broker, client, time.Now().UnixNano()))
			})
		}
	}
}

// benchTransactionCycle times transactions of one record to topic id, each with a note, by a
// producer of kafka's with transactional ID id.
func benchTransactionCycle(b *testing.B, kafka driver.Kafka, id string) {
	p, err := kafka.NewProducer(driver.ProducerConfig{TransactionalID: id, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	ctx := context.Background()
	if err := p.InitTransactions(ctx); err != nil {
		b.Fatal(err)
	}
	place := driver.NotePlace{Group: id + ".notes", Topic: id}
	cycle := func(i int) {
		if err := p.BeginTransaction(); err != nil {
			b.Fatal(err)
		}
		if err := kafkatest.Produce(p, driver.Message{Topic: id, Key: []byte("k"), Value: []byte("v")}, 30*time.Second); err != nil {
			b.Fatal(err)
		}
		if err := p.WriteNote(ctx, place, strconv.Itoa(i)); err != nil {
			b.Fatal(err)
		}
		if d := <-p.Deliveries(); d.Err != nil {
			b.Fatal(d.Err)
		}
		if err := p.CommitTransaction(ctx); err != nil {
			b.Fatal(err)
		}
	}
	cycle(0) // the topic's creation and first metadata are not what is measured
	// Each iteration is cyclesPerOp cycles, so that make bench's single iteration (-benchtime
	// 1x) still gives percentiles.
	const cyclesPerOp = 200
	var took []time.Duration
	b.ResetTimer()
	for b.Loop() {
		for range cyclesPerOp {
			start := time.Now()
			cycle(len(took) + 1)
			took = append(took, time.Since(start))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(len(took))/1000, "ms/txn")
	slices.Sort(took)
	ms := func(q float64) float64 { return float64(took[int(q*float64(len(took)-1))].Microseconds()) / 1000 }
	b.ReportMetric(ms(0.5), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
}

// A record for a topic that does not exist yet, on a cluster that creates topics on demand (as
// Apache Kafka does by default), is published without being reported failed: Kafka's first answer
// for such a topic says it is unknown while it creates it, and kfake's did not.
func TestFirstRecordOfANewTopicIsNotReportedFailed(t *testing.T) {
	r := newIntRig(t)
	topic := r.id + ".created-on-demand"
	st, _ := stasher.New("outbox")
	if err := st.StashPgx(context.Background(), r.pool, goharvest.OutboxRecord{KafkaTopic: topic, KafkaKey: "k", KafkaValue: goharvest.String("v")}); err != nil {
		t.Fatal(err)
	}
	events := &eventRecorder{}
	h := r.harvesterWith("on-demand", goharvest.Limits{}, nil)
	h.SetEventHandler(events.record)
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { h.Stop(); h.Await() }()
	r.waitEmpty(time.Minute)
	if n := events.count("RecordFailed"); n != 0 {
		t.Errorf("%d RecordFailed events for a record whose topic Kafka creates on demand", n)
	}
	if values := consumeValues(t, r.addr, topic, 1); len(values) != 1 {
		t.Errorf("consumed %q, want the one record", values)
	}
}
