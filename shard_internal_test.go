package goharvest

import (
	"strings"
	"testing"
)

// Shards need a binding that can mark by shard; one that cannot is refused at Start, by name,
// rather than publish every shard's rows from every shard's epoch.
func TestShardsNeedAShardingBinding(t *testing.T) {
	r := newRig(t, Limits{})
	h, err := New(Config{
		LeaderGroupID:           "g",
		LeaderTopic:             "t",
		Shards:                  4,
		MetricsRegisterer:       r.registry,
		DatabaseBindingProvider: func(string, string) (DatabaseBinding, error) { return r.db, nil },
		KafkaProducerProvider:   r.kafka.provider,
		NeliProvider:            r.elector.provider,
	})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Start()
	if err == nil || !strings.Contains(err.Error(), "Shards is 4") || !strings.Contains(err.Error(), "cannot mark by shard") {
		t.Fatalf("Start returned %v, want an error saying the binding cannot mark by shard", err)
	}
	if h.State() != Created {
		t.Fatalf("a refused Start left the harvester %v", h.State())
	}
}
