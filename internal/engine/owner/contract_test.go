package owner

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
)

// The fakes the engine's tests run on are the in-memory driver (package memory, which passes the
// contract suites in its own tests) with faults added; with none injected, they keep the same
// contracts, so the faults are all that differs from the real drivers.
func TestFakeStoreContract(t *testing.T) {
	drivertest.RunStore(t, func(t *testing.T) drivertest.Outbox {
		db := newFakeDB()
		return drivertest.Outbox{
			Store:  db,
			Insert: func(_ *testing.T, recs ...driver.OutboxRecord) []int64 { return db.insert(recs...) },
			SetValue: func(_ *testing.T, id int64, value string) {
				db.update(id, func(r *driver.OutboxRecord) { r.KafkaValue = &value })
			},
			Delete: func(_ *testing.T, id int64) { db.Delete(id) },
			Exists: func(_ *testing.T, id int64) bool { return db.exists(id) },
			InsertMalformed: func(_ *testing.T, key string) int64 {
				id := db.insert(driver.OutboxRecord{KafkaTopic: "topic", KafkaKey: key})[0]
				db.SetMalformed(id, "header keys and values differ in number")
				return id
			},
		}
	})
}

func TestFakeProducerContract(t *testing.T) {
	k := newFakeKafka(t, newFakeDB())
	var groups atomic.Int32
	drivertest.RunProducer(t, drivertest.Kafka{
		NewProducer: func(*testing.T, string) driver.KafkaProducer {
			p, _ := k.provider(0)
			return p
		},
		Topic:     func(t *testing.T) string { return "topic-" + strings.ReplaceAll(t.Name(), "/", "-") },
		NoteGroup: func(*testing.T) string { return fmt.Sprintf("notes-%d", groups.Add(1)) },
		Committed: func(_ *testing.T, topic string, _ int) []drivertest.Message {
			var got []drivertest.Message
			for _, m := range k.published() {
				if m.topic == topic {
					var value []byte
					if m.value != nil {
						value = []byte(*m.value)
					}
					got = append(got, drivertest.Message{Key: []byte(m.key), Value: value, Headers: m.headers})
				}
			}
			return got
		},
	})
}
