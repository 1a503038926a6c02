package memory_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/driver/memory"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

// The in-memory outbox keeps the contract the Postgres store keeps (driver/postgres runs the
// same suite on Postgres).
func TestStoreContract(t *testing.T) {
	drivertest.RunStore(t, func(t *testing.T) drivertest.Outbox {
		s := memory.NewStore()
		return drivertest.Outbox{
			Store:  s,
			Insert: func(_ *testing.T, recs ...driver.OutboxRecord) []int64 { return s.Insert(recs...) },
			SetValue: func(_ *testing.T, id int64, value string) {
				s.Update(id, func(r *driver.OutboxRecord) { r.KafkaValue = &value })
			},
			Delete: func(_ *testing.T, id int64) { s.Delete(id) },
			Exists: func(_ *testing.T, id int64) bool { return s.Exists(id) },
			InsertMalformed: func(_ *testing.T, key string) int64 {
				id := s.Insert(driver.OutboxRecord{KafkaTopic: "topic", KafkaKey: key})[0]
				s.SetMalformed(id, "header keys and values differ in number")
				return id
			},
		}
	})
}

// The in-memory producer keeps the contract the librdkafka producer keeps on Apache Kafka
// (driver/librdkafka runs the same suite there).
func TestProducerContract(t *testing.T) {
	b := memory.NewBroker()
	var groups atomic.Int32
	drivertest.RunProducer(t, drivertest.Kafka{
		NewProducer: func(_ *testing.T, txnID string) driver.KafkaProducer { return b.NewProducer(txnID) },
		Topic:       func(t *testing.T) string { return "topic-" + strings.ReplaceAll(t.Name(), "/", "-") },
		NoteGroup:   func(*testing.T) string { return fmt.Sprintf("notes-%d", groups.Add(1)) },
		Committed: func(_ *testing.T, topic string, _ int) []drivertest.Message {
			var got []drivertest.Message
			for _, m := range b.Committed() {
				if m.Topic == topic {
					got = append(got, drivertest.Message{Key: m.Key, Value: m.Value, Headers: m.Headers})
				}
			}
			return got
		},
	})
}

// The in-memory election keeps the contract neli keeps on Apache Kafka (driver/librdkafka runs
// the same suite there), with one partition and with several.
func TestElectorContract(t *testing.T) {
	for _, partitions := range []int{1, 3} {
		t.Run(fmt.Sprint(partitions), func(t *testing.T) {
			drivertest.RunElector(t, func(*testing.T) drivertest.Election {
				el := memory.NewElection(partitions)
				return drivertest.Election{
					Join:       func(_ *testing.T, lost func([]int32)) driver.Elector { return el.Join(lost) },
					Partitions: partitions,
					PulseEvery: time.Millisecond,
					Within:     10 * time.Second,
				}
			})
		})
	}
}

// A revoke runs the barrier at the next Pulse, with the partitions lost, and leadership passes to
// another contender only after the barrier returned.
func TestRevokeRunsTheBarrierBeforeTheHandover(t *testing.T) {
	el := memory.NewElection(2)
	var lost []int32
	entered, release := make(chan struct{}), make(chan struct{})
	first := el.Join(func(p []int32) { lost = p; close(entered); <-release })
	second := el.Join(nil)
	if leading, err := first.Pulse(t.Context()); !leading || err != nil {
		t.Fatalf("the first Pulse = %v, %v; want leading", leading, err)
	}
	done := first.Revoke()
	if first.Leading() {
		t.Fatal("leading after Revoke")
	}
	pulsed := make(chan struct{})
	go func() { defer close(pulsed); first.Pulse(t.Context()) }()
	<-entered
	if leading, _ := second.Pulse(t.Context()); leading {
		t.Fatal("another contender led while the barrier ran")
	}
	close(release)
	<-done
	<-pulsed
	if len(lost) != 2 {
		t.Errorf("the barrier lost %v, want both partitions", lost)
	}
	if leading, _ := second.Pulse(t.Context()); !leading {
		t.Error("the other contender does not lead after the barrier")
	}
	if leading, _ := first.Pulse(t.Context()); leading {
		t.Error("a revoked contender leads again before Elect")
	}
	first.Close(t.Context())
	second.Close(t.Context())
}
