package reaper

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/librdkafka"
)

// The example files' Kafka settings reach the librdkafka client as they reached the producer
// before the client became a driver of its own (issue 35): the reaper leaves Config.Kafka unset,
// so the harvester makes its client from baseKafkaConfig and producerKafkaConfig, and the
// librdkafka client gives each producer these properties. The expected maps were the root package's
// producerSettings output for the same files.
func TestExampleConfigsKeepTheirKafkaSettings(t *testing.T) {
	vars := env(map[string]string{"DATABASE_URL": "postgres://app@db/billing", "KAFKA_PASSWORD": "s3cret"})
	owned := map[string]any{"enable.idempotence": true, "acks": "all", "go.delivery.reports": true, "transactional.id": "goharvest.billing-api"}
	// goharvest's producer defaults that neither example sets.
	defaults := map[string]any{"reconnect.backoff.max.ms": int(librdkafka.DefaultReconnectBackoffMax.Milliseconds()),
		"retry.backoff.ms":       int(librdkafka.DefaultRetryBackoff.Milliseconds()),
		"retry.backoff.max.ms":   int(librdkafka.DefaultRetryBackoffMax.Milliseconds()),
		"go.events.channel.size": librdkafka.DefaultEventsChannelSize, "go.produce.channel.size": 0}
	for name, want := range map[string]map[string]any{
		"reaper.yaml": {
			"bootstrap.servers": "localhost:9092", "compression.type": "lz4",
			"message.timeout.ms": 30000, "transaction.timeout.ms": 60000, "linger.ms": 1, "partitioner": "murmur2_random",
		},
		"reaper-sasl.yaml": {
			"bootstrap.servers": "kafka-1.example.com:9094,kafka-2.example.com:9094", "security.protocol": "SASL_SSL",
			"ssl.ca.location": "/etc/kafka/ca-cert.pem", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "billing-api",
			"sasl.password": "s3cret", "compression.type": "zstd", "linger.ms": 10, "batch.size": 1000000,
			"delivery.timeout.ms": 60000, "transaction.timeout.ms": 60000, "partitioner": "murmur2_random",
			"client.id": "billing-reaper",
		},
	} {
		h := loadExample(t, name, vars).Harvest.WithDefaults()
		if h.Kafka != nil {
			t.Fatalf("%s: the reaper set Config.Kafka; this test reads the client's settings from the maps", name)
		}
		got := librdkafka.New(librdkafka.Config{Properties: h.BaseKafkaConfig, ProducerProperties: h.ProducerKafkaConfig}).
			ProducerSettings(driver.ProducerConfig{
				TransactionalID: goharvest.TransactionalID(h.LeaderGroupID, 0, h.Shards), ClientID: h.Name,
				DeliveryTimeout: h.Limits.QueueTimeout,
			})
		want = maps.Clone(want)
		maps.Copy(want, defaults)
		maps.Copy(want, owned)
		if _, ok := want["client.id"]; !ok {
			want["client.id"] = h.Name
		}
		if !maps.Equal(got, want) {
			t.Errorf("%s: the producer's properties are\n%v\nwant\n%v", name, got, want)
		}
	}
}

// The example files' Kafka settings suit the franz client as well: it takes every property they
// set, and refuses only what it must, the SASL example's CA file, which exists only on the
// example's machine.
func TestExampleConfigsSuitTheFranzClient(t *testing.T) {
	vars := env(map[string]string{"DATABASE_URL": "postgres://app@db/billing", "KAFKA_PASSWORD": "s3cret"})
	for name, want := range map[string][]string{
		"reaper.yaml":      nil,
		"reaper-sasl.yaml": {"BaseKafkaConfig (baseKafkaConfig.ssl.ca.location): open /etc/kafka/ca-cert.pem: no such file or directory"},
	} {
		f := loadExample(t, name, vars)
		f.Harvest.KafkaClient = KafkaClientFranz
		var got []string
		if err := f.Harvest.WithDefaults().Validate(); err != nil {
			_, problems, _ := strings.Cut(err.Error(), "invalid harvest config: ")
			got = strings.Split(problems, "\n")
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s with the franz client: problems %q, want %q", name, got, want)
		}
	}
}
