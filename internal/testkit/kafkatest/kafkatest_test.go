package kafkatest

import (
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/twmb/franz-go/pkg/kerr"
)

// The broker is only useful if the production client talks to it as it would to Kafka.
func TestConfluentClientRoundTrip(t *testing.T) {
	b := Start(t, WithTopics(3, "round-trip"))
	produced := produce(t, b, "round-trip", 20)

	consumer, err := kafka.NewConsumer(&kafka.ConfigMap{
		"bootstrap.servers": b.Addr(),
		"group.id":          "kafkatest",
		"auto.offset.reset": "earliest",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	if err := consumer.Subscribe("round-trip", nil); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	deadline := time.Now().Add(30 * time.Second)
	for len(got) < len(produced) && time.Now().Before(deadline) {
		msg, err := consumer.ReadMessage(200 * time.Millisecond)
		if err != nil {
			continue
		}
		got[string(msg.Value)] = true
	}
	for _, v := range produced {
		if !got[v] {
			t.Errorf("message %q was acknowledged but never consumed", v)
		}
	}
}

func TestFailProduceFailsSomeRequests(t *testing.T) {
	b := Start(t, WithTopics(1, "faulty"))
	fault := b.FailProduce(2, kerr.NotLeaderForPartition)
	defer fault.Remove()
	// The client retries NOT_LEADER_FOR_PARTITION by itself, so every message still lands; the
	// fault shows up only as failed produce requests.
	produce(t, b, "faulty", 10)
	if fault.Hits() == 0 {
		t.Fatal("no produce request was failed")
	}
}

func TestRestartKeepsData(t *testing.T) {
	b := Start(t, WithTopics(1, "kept"))
	produce(t, b, "kept", 1)
	addr := b.Addr()
	if err := b.Restart(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if b.Addr() != addr {
		t.Fatalf("restarted on %s, want %s", b.Addr(), addr)
	}
	produce(t, b, "kept", 1)
}

func produce(t *testing.T, b *Broker, topic string, n int) []string {
	t.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{
		"bootstrap.servers":  b.Addr(),
		"enable.idempotence": true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	var values []string
	delivery := make(chan kafka.Event, n)
	for i := range n {
		v := time.Now().Format(time.RFC3339Nano) + "-" + string(rune('a'+i%26))
		values = append(values, v)
		err := p.Produce(&kafka.Message{
			TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Key:            []byte{byte(i)},
			Value:          []byte(v),
		}, delivery)
		if err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		select {
		case e := <-delivery:
			if m := e.(*kafka.Message); m.TopicPartition.Error != nil {
				t.Fatalf("delivery failed: %v", m.TopicPartition.Error)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no delivery report within 30s")
		}
	}
	return values
}
