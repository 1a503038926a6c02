//go:build cgo

package franz_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/librdkafka"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
)

// These tests hold the franz producer to the librdkafka one where a cluster sees both: a shard
// can move from a harvester of one driver to one of the other (a rolling upgrade), so a note that
// one writes must read back through the other, and a key must land on the same partition
// whichever wrote it.

// newLibrdkafkaProducer returns a librdkafka producer of txnID as a harvester configures it,
// before InitTransactions.
func newLibrdkafkaProducer(t *testing.T, addr, txnID string) driver.KafkaProducer {
	t.Helper()
	kafka := librdkafka.New(librdkafka.Config{Properties: map[string]any{"bootstrap.servers": addr}})
	p, err := kafka.NewProducer(driver.ProducerConfig{TransactionalID: txnID, ClientID: "franz-interop",
		DeliveryTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// session is a producer under test that has registered its transactional ID, with its
// deliveries counted.
type session struct {
	driver.KafkaProducer
	reports chan driver.Delivery
	done    chan struct{} // closed once Deliveries is
}

// open starts p: InitTransactions, and a reader of its Deliveries. Cleanup closes it.
func open(t *testing.T, p driver.KafkaProducer) *session {
	t.Helper()
	s := &session{KafkaProducer: p, reports: make(chan driver.Delivery, 1<<15), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for d := range p.Deliveries() {
			s.reports <- d
		}
	}()
	t.Cleanup(func() {
		p.Close()
		<-s.done
	})
	if err := p.InitTransactions(timeout(t, 30*time.Second)); err != nil {
		t.Fatalf("InitTransactions: %v", err)
	}
	return s
}

// timeout returns a context that ends after d or with the test.
func timeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// publish produces msgs in one transaction, waits for every delivery, which must succeed, writes
// note if it is not empty, and commits.
func (s *session) publish(t *testing.T, note driver.NotePlace, text string, msgs ...driver.Message) {
	t.Helper()
	if err := s.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	pending := 0
	for _, m := range msgs {
		for {
			err := s.send(m)
			if err == nil {
				pending++
				break
			}
			if !errors.Is(err, driver.ErrQueueFull) || pending == 0 {
				t.Fatalf("Produce: %v", err)
			}
			s.await(t, 1) // room comes with a delivery
			pending--
		}
	}
	s.await(t, pending)
	if text != "" {
		if err := s.WriteNote(timeout(t, 30*time.Second), note, text); err != nil {
			t.Fatalf("WriteNote: %v", err)
		}
	}
	if err := s.CommitTransaction(timeout(t, 30*time.Second)); err != nil {
		t.Fatalf("CommitTransaction: %v", err)
	}
}

// send produces m, asking again while the producer looks its topic up (ErrTopicPending).
func (s *session) send(m driver.Message) error {
	return kafkatest.Produce(s, m, time.Minute)
}

// await waits for n deliveries, which must succeed.
func (s *session) await(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for range n {
		select {
		case d := <-s.reports:
			if d.Err != nil {
				t.Fatalf("message %v failed: %v", d.Opaque, d.Err)
			}
		case <-deadline:
			t.Fatalf("deliveries not reported within 60s")
		}
	}
}

func (s *session) readNote(t *testing.T, place driver.NotePlace) string {
	t.Helper()
	note, err := s.ReadNote(timeout(t, 30*time.Second), place)
	if err != nil {
		t.Fatalf("ReadNote: %v", err)
	}
	return note
}

// A note the franz producer commits is what the librdkafka producer that takes over the
// transactional ID reads, and the other way round.
func TestNotesReadAcrossDrivers(t *testing.T) {
	c := kafkacluster.Shared(t)
	run := time.Now().UnixNano()
	topic := c.Topic(t, fmt.Sprintf("franz-interop-notes-%d", run), 1)
	place := driver.NotePlace{Group: fmt.Sprintf("franz-interop-notes-%d", run), Topic: topic}
	txnID := fmt.Sprintf("franz-interop-%d", run)
	msg := driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("v")}

	franzWriter := open(t, newProducer(t, c.Addr(), txnID))
	franzWriter.publish(t, place, "goharvest/2:written-by-franz", msg)
	rdkafka := open(t, newLibrdkafkaProducer(t, c.Addr(), txnID))
	if got := rdkafka.readNote(t, place); got != "goharvest/2:written-by-franz" {
		t.Fatalf("the librdkafka producer read %q, want the franz producer's note", got)
	}
	rdkafka.publish(t, place, "goharvest/2:written-by-librdkafka", msg)
	franzReader := open(t, newProducer(t, c.Addr(), txnID))
	if got := franzReader.readNote(t, place); got != "goharvest/2:written-by-librdkafka" {
		t.Fatalf("the franz producer read %q, want the librdkafka producer's note", got)
	}
}

// partitionedKeys is how many keys TestKeysPartitionAsLibrdkafkaDoes compares, besides the empty
// key; partitionCount is the partitions of its topic, a prime so that no key's hash lands on its
// partition by a common factor.
const (
	partitionedKeys = 10_000
	partitionCount  = 7
)

// Every key, the empty key included, lands on the same partition whichever driver produced it:
// the franz producer's partitioner hashes as librdkafka's "murmur2_random" (the librdkafka
// driver's default) does. Both drivers produce every key to one topic, and a consumer reads back
// where each landed: librdkafka's choice is observed, not recomputed.
//
// A nil key is left out: librdkafka sends one to a random partition, and kgo to a partition
// of its choosing, so the two need not agree and no consumer may expect them to.
func TestKeysPartitionAsLibrdkafkaDoes(t *testing.T) {
	c := kafkacluster.Shared(t)
	run := time.Now().UnixNano()
	topic := c.Topic(t, fmt.Sprintf("franz-interop-keys-%d", run), partitionCount)
	keys := make([][]byte, 0, partitionedKeys+1)
	keys = append(keys, []byte{}) // empty, not nil: it hashes
	for i := range partitionedKeys {
		keys = append(keys, fmt.Appendf(nil, "key-%d", i))
	}
	for _, d := range []struct {
		name string
		new  func(t *testing.T, addr, txnID string) driver.KafkaProducer
	}{{"librdkafka", newLibrdkafkaProducer}, {"franz", newProducer}} {
		msgs := make([]driver.Message, len(keys))
		for i, k := range keys {
			msgs[i] = driver.Message{Topic: topic, Key: k, Value: []byte(d.name), Opaque: i}
		}
		open(t, d.new(t, c.Addr(), fmt.Sprintf("franz-interop-keys-%s-%d", d.name, run))).publish(t, driver.NotePlace{}, "", msgs...)
	}

	partitions := map[string]map[string]int32{"librdkafka": {}, "franz": {}} // driver -> key -> partition
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Addr()), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := timeout(t, 60*time.Second)
	for n := 0; n < 2*len(keys) && ctx.Err() == nil; {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			if r.Key == nil {
				t.Errorf("a record came back with a nil key; every key sent was non-nil")
			}
			partitions[string(r.Value)][string(r.Key)] = r.Partition
			n++
		})
	}
	rd, fr := partitions["librdkafka"], partitions["franz"]
	if len(rd) != len(keys) || len(fr) != len(keys) {
		t.Fatalf("read back %d keys of librdkafka's and %d of franz's, want %d each", len(rd), len(fr), len(keys))
	}
	used := map[int32]bool{}
	mismatched := 0
	for _, k := range keys {
		used[rd[string(k)]] = true
		if rd[string(k)] != fr[string(k)] {
			if mismatched++; mismatched <= 5 {
				t.Errorf("key %q: librdkafka put it on partition %d, franz on %d", k, rd[string(k)], fr[string(k)])
			}
		}
	}
	if mismatched > 0 {
		t.Errorf("%d of %d keys landed on different partitions", mismatched, len(keys))
	}
	if len(used) != partitionCount {
		t.Errorf("the keys used %d of %d partitions; a test of partitioning needs them spread", len(used), partitionCount)
	}
	t.Logf("the empty key: partition %d with librdkafka, %d with franz", rd[""], fr[""])
}

// A producer of either driver fences one of the other with the same transactional ID: the fenced
// one's commit fails fatally, and its message never reaches a consumer.
func TestFencingAcrossDrivers(t *testing.T) {
	c := kafkacluster.Shared(t)
	run := time.Now().UnixNano()
	for i, d := range []struct {
		name     string
		old, new func(t *testing.T, addr, txnID string) driver.KafkaProducer
	}{
		{"franz fences librdkafka", newLibrdkafkaProducer, newProducer},
		{"librdkafka fences franz", newProducer, newLibrdkafkaProducer},
	} {
		t.Run(d.name, func(t *testing.T) {
			topic := c.Topic(t, fmt.Sprintf("franz-interop-fence-%d-%d", run, i), 1)
			txnID := fmt.Sprintf("franz-interop-fence-%d-%d", run, i)
			old := open(t, d.old(t, c.Addr(), txnID))
			if err := old.BeginTransaction(); err != nil {
				t.Fatal(err)
			}
			if err := old.send(driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("deposed")}); err != nil {
				t.Fatal(err)
			}
			old.await(t, 1)
			open(t, d.new(t, c.Addr(), txnID))
			var txnErr *driver.TxnError
			if err := old.CommitTransaction(timeout(t, 30*time.Second)); !errors.As(err, &txnErr) || !txnErr.Fatal {
				t.Errorf("the fenced producer's commit returned %v, want a fatal TxnError", err)
			}
			if got := kafkatest.ReadCommitted(t, c.Addr(), topic, 1, 5*time.Second); len(got) != 0 {
				t.Errorf("a consumer received %d messages of the fenced producer", len(got))
			}
		})
	}
}
