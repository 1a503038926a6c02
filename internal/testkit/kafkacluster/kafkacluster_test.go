package kafkacluster

import (
	"context"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// The shared cluster serves a transactional producer and a read_committed consumer as
// production's would.
func TestSharedClusterRoundTrip(t *testing.T) {
	c := Shared(t)
	if err := c.CreateTopic("round-trip", 3); err != nil {
		t.Fatal(err)
	}
	produceTxn(t, c.Addr(), "round-trip", "a", "b", "c")
	got := consume(t, c.Addr(), "round-trip", 3)
	for _, v := range []string{"a", "b", "c"} {
		if !got[v] {
			t.Errorf("committed record %q never consumed; got %v", v, got)
		}
	}
}

// A 3-node cluster replicates three ways with min.insync.replicas 2, so it keeps serving
// transactions with one node down, and takes the node back when it restarts.
func TestThreeNodesSurviveOneKilled(t *testing.T) {
	c := Start(t, Nodes(3))
	if err := c.CreateTopic("three", 3); err != nil {
		t.Fatal(err)
	}
	produceTxn(t, c.Addr(), "three", "before")
	victim := c.Nodes()[1]
	victim.Kill()
	if victim.Running() {
		t.Fatal("killed node still counts as running")
	}
	produceTxn(t, c.Addr(), "three", "during")
	if err := victim.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.WaitReady(time.Minute); err != nil {
		t.Fatal(err)
	}
	produceTxn(t, c.Addr(), "three", "after")
	got := consume(t, c.Addr(), "three", 3)
	for _, v := range []string{"before", "during", "after"} {
		if !got[v] {
			t.Errorf("committed record %q never consumed; got %v", v, got)
		}
	}
}

func produceTxn(t *testing.T, addr, topic string, values ...string) {
	t.Helper()
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": addr, "transactional.id": "test." + topic,
		"go.delivery.reports": false})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := p.InitTransactions(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, v := range values {
		if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Value: []byte(v)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.CommitTransaction(ctx); err != nil {
		t.Fatal(err)
	}
}

func consume(t *testing.T, addr, topic string, n int) map[string]bool {
	t.Helper()
	cons, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": addr, "group.id": "test." + topic,
		"auto.offset.reset": "earliest", "isolation.level": "read_committed"})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	if err := cons.Subscribe(topic, nil); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for deadline := time.Now().Add(60 * time.Second); len(got) < n && time.Now().Before(deadline); {
		if msg, err := cons.ReadMessage(200 * time.Millisecond); err == nil {
			got[string(msg.Value)] = true
		}
	}
	return got
}

// A client that bootstraps from the proxied listeners is cut off by Partition, and reaches the
// cluster again after Heal; a client of the ordinary listeners is never cut off.
func TestPartitionCutsOffOnlyProxiedClients(t *testing.T) {
	c := Start(t, Proxied())
	topic := c.Topic(t, "partitioned", 1)
	reachable := func(addr string) bool {
		p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": addr, "message.timeout.ms": 3000})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		delivered := make(chan kafka.Event, 1)
		if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
			Value: []byte("x")}, delivered); err != nil {
			t.Fatal(err)
		}
		m := (<-delivered).(*kafka.Message)
		return m.TopicPartition.Error == nil
	}
	if !reachable(c.ProxiedAddr()) {
		t.Fatal("the proxied listeners do not reach the cluster")
	}
	if err := c.Partition(); err != nil {
		t.Fatal(err)
	}
	if reachable(c.ProxiedAddr()) {
		t.Fatal("a proxied client reached the cluster during the partition")
	}
	if !reachable(c.Addr()) {
		t.Fatal("the partition cut off a client of the ordinary listeners")
	}
	if err := c.Heal(); err != nil {
		t.Fatal(err)
	}
	if !reachable(c.ProxiedAddr()) {
		t.Fatal("the proxied client does not reach the cluster after Heal")
	}
}
