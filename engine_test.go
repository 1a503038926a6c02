package goharvest

// Tests of what the root package adds to the engine: its checks at Start, and the default Kafka
// client's settings as Config gives them. The engine's tests are in internal/engine/owner and
// internal/engine/epoch, the librdkafka client's in driver/librdkafka.

import (
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/librdkafka"
	"github.com/goharvest/goharvest/driver/memory"
)

// follower returns an in-memory elector that never leads.
func follower() *memory.Elector {
	e := memory.NewElector(nil)
	e.Revoke()
	return e
}

// stubKafka makes its producers with a real client and gives out one elector.
type stubKafka struct {
	producers driver.Kafka
	elector   driver.Elector
}

func (k stubKafka) NewProducer(p driver.ProducerConfig) (driver.KafkaProducer, error) {
	return k.producers.NewProducer(p)
}
func (k stubKafka) NewElector(driver.ElectorConfig) (driver.Elector, error) { return k.elector, nil }

// localKafka is the librdkafka client for a broker that tests of Start never reach.
func localKafka(elector driver.Elector) stubKafka {
	return stubKafka{librdkafka.New(librdkafka.Config{Properties: map[string]any{"bootstrap.servers": "localhost:9092"}}), elector}
}

// New needs both drivers, and says which is missing and what provides one.
func TestNewRequiresTheDrivers(t *testing.T) {
	_, err := New(Config{LeaderGroupID: "g", LeaderTopic: "t"})
	for _, want := range []string{"Store: required", "postgres.New", "Kafka: required", "franz.New"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New without drivers gave %v, want it to say %q", err, want)
		}
	}
	_, err = New(Config{LeaderGroupID: "g", LeaderTopic: "t", Store: memory.NewStore()})
	if err == nil || strings.Contains(err.Error(), "Store") || !strings.Contains(err.Error(), "Kafka: required") {
		t.Errorf("New without Kafka gave %v", err)
	}
}

func TestStartRejectsBadProducerConfig(t *testing.T) {
	db, elector := memory.NewStore(), follower()
	h, err := New(Config{
		LeaderGroupID:     "g",
		LeaderTopic:       "t",
		MetricsRegisterer: prometheus.NewRegistry(),
		Store:             db,
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
	if !elector.Closed() {
		t.Error("the election was left open after a failed start")
	}
}

// A binding that lacks HeldRowBinding (here, a wrapper that embeds only the DatabaseBinding
// interface and so hides the rest) is refused at Start, by name: with it, a held record could be
// sent again with content that was never read again.
func TestStartRefusesBindingWithoutHeldRows(t *testing.T) {
	type wrapper struct{ driver.DatabaseBinding }
	h, err := New(Config{
		LeaderGroupID:     "g",
		LeaderTopic:       "t",
		MetricsRegisterer: prometheus.NewRegistry(),
		Store:             wrapper{memory.NewStore()},
		Kafka:             localKafka(follower()),
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

// disposals counts a store's Dispose calls.
type disposals struct {
	*memory.Store
	n atomic.Int32
}

func (d *disposals) Dispose() { d.n.Add(1) }

// Start takes the store over: a harvester disposes of it once when it stops, and a Start that
// fails (here, a second harvester of the same name registering its metrics) disposes of it at
// once, so that a caller that gives up on a harvester leaks no connections.
func TestStartTakesTheStoreOver(t *testing.T) {
	registry := prometheus.NewRegistry()
	harvester := func(store driver.DatabaseBinding) *Harvest {
		h, err := New(Config{LeaderGroupID: "g", LeaderTopic: "t", Name: "same", MetricsRegisterer: registry,
			Store: store, Kafka: localKafka(follower())})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	first, second := &disposals{Store: memory.NewStore()}, &disposals{Store: memory.NewStore()}
	running := harvester(first)
	if err := running.Start(); err != nil {
		t.Fatal(err)
	}
	if err := harvester(second).Start(); err == nil || !strings.Contains(err.Error(), "register metrics") {
		t.Fatalf("a second harvester named alike started: %v", err)
	}
	if n := second.n.Load(); n != 1 {
		t.Errorf("a failed Start disposed of its store %d times, want 1", n)
	}
	if n := first.n.Load(); n != 0 {
		t.Errorf("a running harvester's store was disposed of %d times", n)
	}
	running.Stop()
	if err := running.Await(); err != nil {
		t.Fatal(err)
	}
	if n := first.n.Load(); n != 1 {
		t.Errorf("a stopped harvester disposed of its store %d times, want 1", n)
	}
}
