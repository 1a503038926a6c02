package librdkafka_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/driver/librdkafka"
	"github.com/goharvest/goharvest/internal/kafkacluster"
	outboxpkg "github.com/goharvest/goharvest/outbox"
)

var contractTopics atomic.Int32

// The librdkafka producer, configured as a harvester configures it, keeps the producer contract on
// Apache Kafka that the engine's fake producer keeps too (internal/owner runs the same suite).
func TestConfluentProducerContract(t *testing.T) {
	c := kafkacluster.Shared(t)
	run := time.Now().UnixNano()
	drivertest.RunProducer(t, drivertest.Kafka{
		NewProducer: func(t *testing.T, txnID string) driver.KafkaProducer {
			kafka := librdkafka.New(librdkafka.Config{Properties: map[string]any{"bootstrap.servers": c.Addr()}})
			p, err := kafka.NewProducer(driver.ProducerConfig{TransactionalID: txnID, ClientID: "contract",
				DeliveryTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		Topic: func(t *testing.T) string {
			return c.Topic(t, fmt.Sprintf("contract-%d-%d", run, contractTopics.Add(1)), 1)
		},
		NoteGroup: func(t *testing.T) string { return fmt.Sprintf("contract-notes-%d-%d", run, contractTopics.Add(1)) },
		Committed: func(t *testing.T, topic string, want int) []drivertest.Message {
			return readCommitted(t, c.Addr(), topic, want, 5*time.Second)
		},
	})
}

// readCommitted reads topic from the start as a read_committed consumer until it has want
// messages or within has passed.
func readCommitted(t *testing.T, addr, topic string, want int, within time.Duration) []drivertest.Message {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var got []drivertest.Message
	for len(got) < want && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			m := drivertest.Message{Key: r.Key, Value: r.Value}
			for _, h := range r.Headers {
				m.Headers = append(m.Headers, outboxpkg.Header{Key: h.Key, Value: string(h.Value)})
			}
			got = append(got, m)
		})
	}
	return got
}
