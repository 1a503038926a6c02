package goharvest

import (
	"strings"
	"testing"
)

// The producer partitions as the Java client does unless the configuration names a
// partitioner, in either map.
func TestProducerPartitionerDefault(t *testing.T) {
	for _, c := range []struct {
		name           string
		base, producer KafkaConfigMap
		want           any
	}{
		{"default", nil, nil, DefaultPartitioner},
		{"producer", nil, KafkaConfigMap{"partitioner": "consistent_random"}, "consistent_random"},
		{"base", KafkaConfigMap{"partitioner": "consistent_random"}, nil, "consistent_random"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, err := New(Config{LeaderGroupID: "g", LeaderTopic: "t", BaseKafkaConfig: c.base, ProducerKafkaConfig: c.producer})
			if err != nil {
				t.Fatal(err)
			}
			if got := h.producerConfig["partitioner"]; got != c.want {
				t.Errorf("partitioner = %v, want %v", got, c.want)
			}
		})
	}
}

func TestIDHeaderConfig(t *testing.T) {
	c, err := Unmarshal([]byte("idHeader: goharvest-id\n"))
	if err != nil || c.IDHeader != "goharvest-id" {
		t.Fatalf("got %q, %v", c.IDHeader, err)
	}
	if c := validConfig(); c.IDHeader != "" || c.Validate() != nil {
		t.Fatalf("the default is %q (%v), want empty: no id header", c.IDHeader, c.Validate())
	}
	for _, bad := range []string{" id", "id\x00", "\xff"} {
		c := validConfig()
		c.IDHeader = bad
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "IDHeader (idHeader)") {
			t.Errorf("IDHeader %q: got %v, want an error naming IDHeader (idHeader)", bad, err)
		}
	}
}
