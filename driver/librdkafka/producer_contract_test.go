package librdkafka_test

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/driver/librdkafka"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
)

var contractTopics atomic.Int32

// The librdkafka producer, configured as a harvester configures it, keeps the producer contract on
// Apache Kafka that the engine's fake producer keeps too (internal/engine/owner runs the same suite).
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
			return kafkatest.ReadCommitted(t, c.Addr(), topic, want, 5*time.Second)
		},
	})
}
