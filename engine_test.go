package goharvest

// Tests of what the root package adds to the engine: the producer's settings, and the
// confluent producer's own checks. The engine's tests are in internal/owner and internal/epoch.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/memory"
	"github.com/goharvest/goharvest/neli"
	"github.com/prometheus/client_golang/prometheus"
)

// follower returns an in-memory elector that never leads, seen as neli is (the root's Elector).
func follower() neliView {
	e := memory.NewElector(nil)
	e.Revoke()
	return neliView{e}
}

// stubElector never leads; it counts its pulses. postgres_failover_test.go reads its fields.
// TODO(issue 35): replace it by follower() once that file may be edited.
type stubElector struct {
	mu     sync.Mutex
	pulses int
}

func (e *stubElector) Pulse(context.Context) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pulses++
	return false, nil
}
func (*stubElector) State() neli.State           { return neli.Follower }
func (*stubElector) Partitions() []int32         { return nil }
func (*stubElector) Close(context.Context) error { return nil }

// neliView shows an in-memory elector in neli's states, as the root's Elector.
type neliView struct{ *memory.Elector }

func (e neliView) State() neli.State {
	switch {
	case e.Leading():
		return neli.Leader
	case e.Fenced():
		return neli.Fenced
	}
	return neli.Follower
}

// The transaction timeout follows a long QueueTimeout unless set; set too short, it is an error
// naming both.
func TestTransactionTimeoutFollowsQueueTimeout(t *testing.T) {
	h, err := New(Config{LeaderGroupID: "g", LeaderTopic: "t", Limits: Limits{QueueTimeout: 90 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if got := h.producerConfig["transaction.timeout.ms"]; got != 90_000 {
		t.Errorf("transaction.timeout.ms = %v, want 90000", got)
	}
	h, err = New(Config{LeaderGroupID: "g", LeaderTopic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if got := h.producerConfig["transaction.timeout.ms"]; got != 60_000 {
		t.Errorf("transaction.timeout.ms = %v by default, want librdkafka's 60000", got)
	}
	_, err = New(Config{LeaderGroupID: "g", LeaderTopic: "t", Limits: Limits{QueueTimeout: 90 * time.Second},
		ProducerKafkaConfig: KafkaConfigMap{"transaction.timeout.ms": "70000"}})
	if err == nil || !strings.Contains(err.Error(), "producerKafkaConfig.transaction.timeout.ms") {
		t.Fatalf("a transaction timeout shorter than the message timeout gave %v", err)
	}
}

func TestStartRejectsBadProducerConfig(t *testing.T) {
	db, elector := memory.NewStore(), follower()
	h, err := New(Config{
		LeaderGroupID:           "g",
		LeaderTopic:             "t",
		MetricsRegisterer:       prometheus.NewRegistry(),
		ProducerKafkaConfig:     KafkaConfigMap{"compresion.type": "lz4"},
		DatabaseBindingProvider: func(string, string) (driver.DatabaseBinding, error) { return db, nil },
		NeliProvider:            func(neli.Config) (Elector, error) { return elector, nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Start()
	if err == nil || !strings.Contains(err.Error(), "compresion.type") {
		t.Fatalf("Start returned %v, want an error naming the misspelt property", err)
	}
	if !elector.Closed() {
		t.Error("the election was left open after a failed start")
	}
}

// The producer lingers DefaultProducerLinger unless the configuration says otherwise, under
// either of librdkafka's names.
func TestProducerLingerDefault(t *testing.T) {
	for _, c := range []struct {
		name string
		set  KafkaConfigMap
		want map[string]any
	}{
		{"default", nil, map[string]any{"linger.ms": DefaultProducerLinger}},
		{"set", KafkaConfigMap{"linger.ms": 20}, map[string]any{"linger.ms": 20}},
		{"alias", KafkaConfigMap{"queue.buffering.max.ms": 20}, map[string]any{"linger.ms": nil, "queue.buffering.max.ms": 20}},
	} {
		t.Run(c.name, func(t *testing.T) {
			h, err := New(Config{LeaderGroupID: "g", LeaderTopic: "t", ProducerKafkaConfig: c.set})
			if err != nil {
				t.Fatal(err)
			}
			for k, v := range c.want {
				if got := h.producerConfig[k]; got != v {
					t.Errorf("%s = %v, want %v", k, got, v)
				}
			}
		})
	}
}

// goharvest's own checks say so, and are not worded as Kafka's refusals.
func TestOwnChecksAreNotWordedAsKafkas(t *testing.T) {
	c := &confluentProducer{topics: map[string]topicState{}}
	err := c.checkTopic("no such topic!")
	var rejected *driver.RejectedError
	if !errors.As(err, &rejected) {
		t.Fatalf("checkTopic of an invalid name returned %v, want a *RejectedError", err)
	}
	if msg := err.Error(); strings.Contains(msg, "by Kafka") || !strings.Contains(msg, "by goharvest") {
		t.Errorf("an invalid topic name is reported as %q; it is goharvest's check, not Kafka's", msg)
	}
	kafkaErr := &driver.RejectedError{Err: errors.New("Broker: Message size too large")}
	if !strings.HasPrefix(kafkaErr.Error(), "rejected by Kafka") {
		t.Errorf("a broker's refusal reads %q", kafkaErr.Error())
	}
	malformed := &driver.RecordError{ID: 7, Reason: "kafka_header_keys has 2 elements but kafka_header_values has 1"}
	if strings.Contains(malformed.Error(), "Kafka") {
		t.Errorf("a malformed row reads %q", malformed.Error())
	}
}

// A binding that lacks HeldRowBinding (here, a wrapper that embeds only the DatabaseBinding
// interface and so hides the rest) is refused at Start, by name: with it, a held record could be
// sent again with content that was never read again.
func TestStartRefusesBindingWithoutHeldRows(t *testing.T) {
	type wrapper struct{ driver.DatabaseBinding }
	h, err := New(Config{
		LeaderGroupID:           "g",
		LeaderTopic:             "t",
		MetricsRegisterer:       prometheus.NewRegistry(),
		DatabaseBindingProvider: func(string, string) (driver.DatabaseBinding, error) { return wrapper{memory.NewStore()}, nil },
		NeliProvider:            func(neli.Config) (Elector, error) { return follower(), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	err = h.Start()
	if err == nil || !strings.Contains(err.Error(), "does not implement HeldRowBinding") {
		h.Stop()
		h.Await()
		t.Fatalf("Start with a binding that hides HeldRowBinding returned %v", err)
	}
}
