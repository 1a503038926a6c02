//go:build cgo

package bench_test

import (
	"context"
	"testing"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/google/uuid"

	outboxpkg "github.com/goharvest/goharvest/outbox"
)

func init() { floorProducers["librdkafka"] = librdkafkaFloorProducer }

// librdkafkaFloorProducer is librdkafka's producer with enable.idempotence (so acks=all), its
// other settings librdkafka's defaults; transactional, with a transactional ID of its own.
func librdkafkaFloorProducer(b *testing.B, addr string, transactional bool) (func(context.Context, []outboxpkg.Record) error, func()) {
	config := kafka.ConfigMap{"bootstrap.servers": addr, "enable.idempotence": true}
	if transactional {
		config["transactional.id"] = "bench-floor-" + uuid.NewString()
	}
	p, err := kafka.NewProducer(&config)
	if err != nil {
		b.Fatal(err)
	}
	if transactional {
		if err := p.InitTransactions(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	go func() {
		for range p.Events() { // logs and errors librdkafka reports outside deliveries
		}
	}()
	produce := func(ctx context.Context, records []outboxpkg.Record) error {
		delivered := make(chan kafka.Event, len(records))
		for _, r := range records {
			msg := &kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &r.KafkaTopic, Partition: kafka.PartitionAny}, Key: []byte(r.KafkaKey)}
			if r.KafkaValue != nil {
				msg.Value = []byte(*r.KafkaValue)
			}
			for _, h := range r.KafkaHeaders {
				msg.Headers = append(msg.Headers, kafka.Header{Key: h.Key, Value: []byte(h.Value)})
			}
			if err := p.Produce(msg, delivered); err != nil {
				return err
			}
		}
		for range records {
			if m := (<-delivered).(*kafka.Message); m.TopicPartition.Error != nil {
				return m.TopicPartition.Error
			}
		}
		return nil
	}
	if !transactional {
		return produce, p.Close
	}
	end := func(ctx context.Context, commit bool) error {
		if commit {
			return p.CommitTransaction(ctx)
		}
		return p.AbortTransaction(ctx)
	}
	return transactionally(produce, p.BeginTransaction, end), p.Close
}
