package embed_test

import (
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
)

// A broker that refuses the producer's transaction timeout (above its transaction.max.timeout.ms)
// refuses it every time: the harvester stops with an error that names the cause, rather than
// retrying for ever while its readiness probe says all is well.
func TestHarvestStopsWhenKafkaRefusesItsTransactions(t *testing.T) {
	// A cluster of its own, which allows transactions of at most 5s: the harvester asks for 60s.
	c := kafkacluster.Start(t, kafkacluster.BrokerConfig(map[string]string{"transaction.max.timeout.ms": "5000"}))
	for _, client := range kafkaClients {
		t.Run(string(client), func(t *testing.T) { stopsWhenKafkaRefusesItsTransactions(t, c, client) })
	}
}

func stopsWhenKafkaRefusesItsTransactions(t *testing.T, c *kafkacluster.Cluster, client reaper.KafkaClient) {
	r := newIntRigOn(t, c)
	r.load(2, 2)
	h := r.harvesterWith("harvest-int", goharvest.Limits{IOErrorBackoff: 50 * time.Millisecond}, nil,
		func(cfg *harvestSettings) { cfg.KafkaClient = client })
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- h.Await() }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "refuses the producer's settings") ||
			!strings.Contains(strings.ToLower(err.Error()), "transaction timeout") {
			t.Fatalf("the harvester stopped with %v, want the refused transaction timeout named", err)
		}
		t.Logf("stopped with: %v", err)
	case <-time.After(30 * time.Second):
		h.Stop()
		<-done
		t.Fatal("the harvester kept retrying a transaction timeout the broker refuses")
	}
	if n := r.outboxRows(); n != 4 {
		t.Errorf("%d rows left, want all 4", n)
	}
}

// A QueueTimeout above the default transaction timeout (60s, librdkafka's, which the franz client
// keeps too) raises the transaction timeout with it, rather than making the producer refuse to
// start; with each Kafka client.
func TestHarvestWithLongQueueTimeout(t *testing.T) {
	for _, client := range kafkaClients {
		t.Run(string(client), func(t *testing.T) { harvestWithLongQueueTimeout(t, client) })
	}
}

func harvestWithLongQueueTimeout(t *testing.T, client reaper.KafkaClient) {
	r := newIntRig(t)
	expected := r.load(10, 10)
	v := r.verifier()
	h := r.harvesterWith("harvest-int", goharvest.Limits{IOErrorBackoff: 50 * time.Millisecond, QueueTimeout: 90 * time.Second}, nil,
		func(cfg *harvestSettings) { cfg.KafkaClient = client })
	r.runUntilDelivered(h, v, 100)
	checkDelivered(t, v, expected)
}
