package goharvest

// Tests of what the root package adds to the engine: its checks at Start, and the default Kafka
// client's settings as Config gives them. The engine's tests are in internal/owner and
// internal/epoch, the librdkafka client's in driver/librdkafka.

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/librdkafka"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
)

// stubStore is an empty outbox, for tests that only start a harvester.
type stubStore struct{}

func (stubStore) Mark(context.Context, uuid.UUID, int) ([]driver.MarkedRecord, error) {
	return nil, nil
}
func (stubStore) MarkExcept(context.Context, uuid.UUID, int, []string) ([]driver.MarkedRecord, error) {
	return nil, nil
}
func (stubStore) Purge(context.Context, []int64) (int, error)                       { return 0, nil }
func (stubStore) Reset(context.Context, uuid.UUID, []int64) (int, error)            { return 0, nil }
func (stubStore) Reread(context.Context, []int64) ([]driver.RereadRecord, error)    { return nil, nil }
func (stubStore) PurgeUnchanged(context.Context, map[int64]string) ([]int64, error) { return nil, nil }
func (stubStore) DeadLetter(context.Context, int64, string, driver.DeadLetterInfo) (bool, error) {
	return false, nil
}
func (stubStore) Read(context.Context, int, []string, []int64) ([]driver.MarkedRecord, error) {
	return nil, nil
}
func (stubStore) Dispose() {}

// stubKafka makes its producers with a real client and gives out one elector.
type stubKafka struct {
	producers driver.Kafka
	elector   driver.Elector
}

func (k stubKafka) NewProducer(p driver.ProducerConfig) (driver.KafkaProducer, error) {
	return k.producers.NewProducer(p)
}
func (k stubKafka) NewElector(driver.ElectorConfig) (driver.Elector, error) { return k.elector, nil }

// stubElector never leads; it counts its pulses and records whether it was closed.
type stubElector struct {
	mu     sync.Mutex
	pulses int
	closed bool
}

func (e *stubElector) Pulse(context.Context) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pulses++
	return false, nil
}
func (*stubElector) Leading() bool       { return false }
func (*stubElector) Fenced() bool        { return false }
func (*stubElector) Partitions() []int32 { return nil }
func (e *stubElector) Close(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return nil
}

// A transaction timeout shorter than the message timeout is an error naming both, with the
// field it stands in (the default client's settings are driver/librdkafka's tests).
func TestTransactionTimeoutShorterThanQueueTimeout(t *testing.T) {
	_, err := New(Config{LeaderGroupID: "g", LeaderTopic: "t", Limits: Limits{QueueTimeout: 90 * time.Second},
		ProducerKafkaConfig: KafkaConfigMap{"transaction.timeout.ms": "70000"}})
	if err == nil || !strings.Contains(err.Error(), "ProducerKafkaConfig (producerKafkaConfig.transaction.timeout.ms): 1m10s is shorter") {
		t.Fatalf("a transaction timeout shorter than the message timeout gave %v", err)
	}
}

// The default client's properties configure it alone: set beside a client of the caller's, they
// would be ignored, so they are refused.
func TestKafkaPropertiesWithAClientOfOnesOwn(t *testing.T) {
	_, err := New(Config{LeaderGroupID: "g", LeaderTopic: "t", Kafka: stubKafka{},
		BaseKafkaConfig: KafkaConfigMap{"bootstrap.servers": "b:9092"}})
	if err == nil || !strings.Contains(err.Error(), "configures the default Kafka client only") {
		t.Fatalf("BaseKafkaConfig beside Config.Kafka gave %v", err)
	}
}

func TestStartRejectsBadProducerConfig(t *testing.T) {
	db, elector := stubStore{}, &stubElector{}
	h, err := New(Config{
		LeaderGroupID:           "g",
		LeaderTopic:             "t",
		MetricsRegisterer:       prometheus.NewRegistry(),
		DatabaseBindingProvider: func(string, string) (driver.DatabaseBinding, error) { return db, nil },
		Kafka: stubKafka{librdkafka.New(librdkafka.Config{
			Properties:         map[string]any{"bootstrap.servers": "localhost:9092"},
			ProducerProperties: map[string]any{"compresion.type": "lz4"},
		}), elector},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Start()
	if err == nil || !strings.Contains(err.Error(), "compresion.type") {
		t.Fatalf("Start returned %v, want an error naming the misspelt property", err)
	}
	if !elector.closed {
		t.Error("the election was left open after a failed start")
	}
}

// A binding that lacks HeldRowBinding (here, a wrapper that embeds only the DatabaseBinding
// interface and so hides the rest) is refused at Start, by name: with it, a held record could be
// sent again with content that was never read again.
func TestStartRefusesBindingWithoutHeldRows(t *testing.T) {
	type wrapper struct{ driver.DatabaseBinding }
	h, err := New(Config{
		LeaderGroupID:           "g",
		LeaderTopic:             "t",
		MetricsRegisterer:       prometheus.NewRegistry(),
		DatabaseBindingProvider: func(string, string) (driver.DatabaseBinding, error) { return wrapper{stubStore{}}, nil },
		Kafka:                   stubKafka{librdkafka.New(librdkafka.Config{Properties: map[string]any{"bootstrap.servers": "localhost:9092"}}), &stubElector{}},
	})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Start()
	if err == nil || !strings.Contains(err.Error(), "does not implement HeldRowBinding") {
		h.Stop()
		h.Await()
		t.Fatalf("Start with a binding that hides HeldRowBinding returned %v", err)
	}
}
