package owner

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/producertest"
	"github.com/goharvest/goharvest/internal/storetest"
)

// The in-memory outbox the engine's tests run on keeps the contract the Postgres binding keeps
// (the root package runs the same suite on Postgres).
func TestFakeStoreContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T) storetest.Outbox {
		db := newFakeDB()
		return storetest.Outbox{
			Store:  db,
			Insert: func(_ *testing.T, recs ...driver.OutboxRecord) []int64 { return db.insert(recs...) },
			SetValue: func(_ *testing.T, id int64, value string) {
				db.update(id, func(r *driver.OutboxRecord) { r.KafkaValue = &value })
			},
			Delete: func(_ *testing.T, id int64) { db.delete(id) },
			Exists: func(_ *testing.T, id int64) bool { return db.exists(id) },
			InsertMalformed: func(_ *testing.T, key string) int64 {
				id := db.insert(driver.OutboxRecord{KafkaTopic: "topic", KafkaKey: key})[0]
				db.markErr = map[int64]error{id: &driver.RecordError{ID: id, Reason: "header keys and values differ in number"}}
				return id
			},
		}
	})
}

// The fake producer the engine's tests run on keeps the contract the confluent producer keeps on
// Apache Kafka (the root package runs the same suite there).
func TestFakeProducerContract(t *testing.T) {
	k := newFakeKafka(t, newFakeDB())
	var groups atomic.Int32
	producertest.Run(t, producertest.Kafka{
		NewProducer: func(*testing.T, string) driver.KafkaProducer {
			p, _ := k.provider(0)
			return p
		},
		Topic:     func(t *testing.T) string { return "topic-" + strings.ReplaceAll(t.Name(), "/", "-") },
		NoteGroup: func(*testing.T) string { return fmt.Sprintf("notes-%d", groups.Add(1)) },
		Committed: func(_ *testing.T, topic string, _ int) []producertest.Message {
			var got []producertest.Message
			for _, m := range k.published() {
				if m.topic == topic {
					var value []byte
					if m.value != nil {
						value = []byte(*m.value)
					}
					got = append(got, producertest.Message{Key: []byte(m.key), Value: value, Headers: m.headers})
				}
			}
			return got
		},
	})
}
