package goharvest

import (
	"strings"
	"testing"
)

func TestMessage(t *testing.T) {
	headers := make(KafkaHeaders, 1, 4) // room to append into, which message must not use
	headers[0] = KafkaHeader{Key: "a", Value: "1"}
	rec := OutboxRecord{ID: 12345, KafkaTopic: "t", KafkaKey: "", KafkaValue: String("\x00v"), KafkaHeaders: headers}

	m := message(&rec, "", "opaque")
	if m.Key == nil || len(m.Key) != 0 {
		t.Errorf("the empty key became %#v; it must stay a key (non-nil, empty), or the partitioner spreads it", m.Key)
	}
	if string(m.Value) != "\x00v" || m.Topic != "t" || m.Opaque != "opaque" || len(m.Headers) != 1 {
		t.Errorf("got %+v", m)
	}

	m = message(&rec, "goharvest-id", nil)
	if len(m.Headers) != 2 || m.Headers[0] != headers[0] || m.Headers[1] != (KafkaHeader{Key: "goharvest-id", Value: "12345"}) {
		t.Errorf("headers %v, want the record's and then goharvest-id=12345", m.Headers)
	}
	if extra := headers[:2][1]; extra != (KafkaHeader{}) {
		t.Errorf("message wrote %v into the record's header array", extra)
	}

	tombstone := OutboxRecord{KafkaKey: "k"}
	if m := message(&tombstone, "", nil); m.Value != nil {
		t.Errorf("a NULL value became %#v, want nil (a tombstone)", m.Value)
	}
	if m := message(&OutboxRecord{KafkaValue: String("")}, "", nil); m.Value == nil {
		t.Error("an empty value became a tombstone")
	}
}

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
