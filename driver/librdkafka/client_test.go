package librdkafka

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
)

// settings returns the properties a producer gets from a client with these maps, for a harvester
// whose QueueTimeout is deliveryTimeout.
func settings(base, producer map[string]any, deliveryTimeout time.Duration) map[string]any {
	return New(Config{Properties: base, ProducerProperties: producer}).ProducerSettings(driver.ProducerConfig{
		TransactionalID: "goharvest.g", ClientID: "h1", DeliveryTimeout: deliveryTimeout,
	})
}

// The transaction timeout follows a long delivery timeout unless set; set too short, it is a
// problem naming both.
func TestTransactionTimeoutFollowsDeliveryTimeout(t *testing.T) {
	if got := settings(nil, nil, 90*time.Second)["transaction.timeout.ms"]; got != 90_000 {
		t.Errorf("transaction.timeout.ms = %v, want 90000", got)
	}
	if got := settings(nil, nil, 30*time.Second)["transaction.timeout.ms"]; got != 60_000 {
		t.Errorf("transaction.timeout.ms = %v by default, want librdkafka's 60000", got)
	}
	problems := Config{ProducerProperties: map[string]any{"transaction.timeout.ms": "70000"}}.Problems(90 * time.Second)
	if len(problems) != 1 || !problems[0].Producer || problems[0].Property != "transaction.timeout.ms" ||
		!strings.Contains(problems[0].Reason, "shorter than the message timeout (1m30s") {
		t.Fatalf("a transaction timeout shorter than the message timeout gave %+v", problems)
	}
}

// Properties goharvest owns are refused, each with its reason, in whichever map they stand.
func TestOwnedPropertiesAreProblems(t *testing.T) {
	problems := Config{
		Properties:         map[string]any{"group.id": "x", "bootstrap.servers": "b:9092"},
		ProducerProperties: map[string]any{"acks": 1, "compression.type": []string{"lz4"}},
	}.Problems(time.Minute)
	var got []string
	for _, p := range problems {
		got = append(got, p.Property)
	}
	if want := "group.id acks compression.type"; strings.Join(got, " ") != want {
		t.Fatalf("problems %+v, want %s", problems, want)
	}
	if !strings.Contains(problems[2].Reason, "string, number or boolean") {
		t.Errorf("a list value reads %q", problems[2].Reason)
	}
}

// The producer lingers DefaultLinger unless the configuration says otherwise, under either of
// librdkafka's names; the client ID is the harvester's name unless set.
func TestProducerLingerDefault(t *testing.T) {
	for _, c := range []struct {
		name string
		set  map[string]any
		want map[string]any
	}{
		{"default", nil, map[string]any{"linger.ms": DefaultLinger, "client.id": "h1"}},
		{"set", map[string]any{"linger.ms": 20, "client.id": "mine"}, map[string]any{"linger.ms": 20, "client.id": "mine"}},
		{"alias", map[string]any{"queue.buffering.max.ms": 20}, map[string]any{"linger.ms": nil, "queue.buffering.max.ms": 20}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := settings(nil, c.set, time.Minute)
			for k, v := range c.want {
				if got := s[k]; got != v {
					t.Errorf("%s = %v, want %v", k, got, v)
				}
			}
			if s["transactional.id"] != "goharvest.g" || s["acks"] != "all" || s["enable.idempotence"] != true {
				t.Errorf("the owned properties are %v", s)
			}
		})
	}
}

// The producer partitions as the Java client does unless the configuration names a
// partitioner, in either map.
func TestProducerPartitionerDefault(t *testing.T) {
	for _, c := range []struct {
		name           string
		base, producer map[string]any
		want           any
	}{
		{"default", nil, nil, DefaultPartitioner},
		{"producer", nil, map[string]any{"partitioner": "consistent_random"}, "consistent_random"},
		{"base", map[string]any{"partitioner": "consistent_random"}, nil, "consistent_random"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := settings(c.base, c.producer, time.Minute)["partitioner"]; got != c.want {
				t.Errorf("partitioner = %v, want %v", got, c.want)
			}
		})
	}
}

// The producer looks for a moved transaction coordinator at least every DefaultReconnectBackoffMax,
// and retries a request after DefaultRetryBackoff, doubling up to DefaultRetryBackoffMax, unless
// the configuration says otherwise, in either map; a first wait of the user's keeps librdkafka's
// most, which librdkafka would otherwise hold it to.
func TestProducerBackoffDefaults(t *testing.T) {
	for _, c := range []struct {
		name, property string
		base, producer map[string]any
		want           any
	}{
		{"default", "reconnect.backoff.max.ms", nil, nil, 250},
		{"producer", "reconnect.backoff.max.ms", nil, map[string]any{"reconnect.backoff.max.ms": 10000}, 10000},
		{"base", "reconnect.backoff.max.ms", map[string]any{"reconnect.backoff.max.ms": 5000}, nil, 5000},
		{"default", "retry.backoff.ms", nil, nil, 10},
		{"producer", "retry.backoff.ms", nil, map[string]any{"retry.backoff.ms": 100}, 100},
		{"base", "retry.backoff.ms", map[string]any{"retry.backoff.ms": 50}, nil, 50},
		{"default", "retry.backoff.max.ms", nil, nil, 250},
		{"producer", "retry.backoff.max.ms", nil, map[string]any{"retry.backoff.max.ms": 2000}, 2000},
		{"base", "retry.backoff.max.ms", map[string]any{"retry.backoff.max.ms": 100}, nil, 100},
		{"beside a first wait of the user's", "retry.backoff.max.ms", nil, map[string]any{"retry.backoff.ms": 500}, nil},
	} {
		t.Run(c.property+"/"+c.name, func(t *testing.T) {
			if got := settings(c.base, c.producer, time.Minute)[c.property]; got != c.want {
				t.Errorf("%s = %v, want %v", c.property, got, c.want)
			}
		})
	}
}

// goharvest's own checks say so, and are not worded as Kafka's refusals.
func TestOwnChecksAreNotWordedAsKafkas(t *testing.T) {
	c := &confluentProducer{} // an invalid name is refused before any lookup, so no topic checker is needed
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
