//go:build cgo

package franz_test

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
)

var contractTopics atomic.Int32

// The franz producer, configured as a harvester would configure it, keeps the producer contract
// on Apache Kafka that the librdkafka producer and the engine's fake keep too.
func TestFranzProducerContract(t *testing.T) {
	c := kafkacluster.Shared(t)
	run := time.Now().UnixNano()
	drivertest.RunProducer(t, drivertest.Kafka{
		NewProducer: func(t *testing.T, txnID string) driver.KafkaProducer {
			return newProducer(t, c.Addr(), txnID)
		},
		Topic: func(t *testing.T) string {
			return c.Topic(t, fmt.Sprintf("franz-contract-%d-%d", run, contractTopics.Add(1)), 1)
		},
		NoteGroup: func(t *testing.T) string {
			return fmt.Sprintf("franz-contract-notes-%d-%d", run, contractTopics.Add(1))
		},
		Committed: func(t *testing.T, topic string, want int) []drivertest.Message {
			return kafkatest.ReadCommitted(t, c.Addr(), topic, want, 5*time.Second)
		},
	})
}

// newProducer returns a franz producer of txnID, before InitTransactions.
func newProducer(t *testing.T, addr, txnID string) driver.KafkaProducer {
	t.Helper()
	kafka := franz.New(franz.Config{SeedBrokers: []string{addr}})
	p, err := kafka.NewProducer(driver.ProducerConfig{TransactionalID: txnID, ClientID: "franz-contract",
		DeliveryTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
