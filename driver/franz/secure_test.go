//go:build cgo

package franz_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
)

// The librdkafka properties of a SASL_SSL cluster, as a reaper's YAML holds them (SCRAM-SHA-512
// over TLS, the cluster's own CA in ssl.ca.location, the host name checked), take the franz
// producer there through FromProperties: it registers its transactional ID and commits. The
// listener speaks nothing but SASL_SSL, so neither TLS nor SASL can have been left out.
func TestPropertiesReachASecureCluster(t *testing.T) {
	c := kafkacluster.Start(t, kafkacluster.Secure())
	topic := c.Topic(t, "franz-secure", 1)
	props, err := c.ClientConfig(kafkacluster.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	base := map[string]any{}
	for k, v := range props {
		base[k] = v
	}
	cfg, problems := franz.FromProperties(base, map[string]any{"compression.type": "zstd", "linger.ms": 5}, 30*time.Second)
	if len(problems) > 0 {
		t.Fatalf("the cluster's properties %v: %+v", props, problems)
	}
	p, err := franz.New(cfg).NewProducer(driver.ProducerConfig{TransactionalID: "franz-secure", ClientID: "franz-secure",
		DeliveryTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	open(t, p).publish(t, driver.NotePlace{}, "", driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("v")})

	// A consumer with the shared options (Opts, as the election will have them) reads it back.
	consumer, err := kgo.NewClient(append(cfg.Opts, kgo.SeedBrokers(cfg.SeedBrokers...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer consumer.Close()
	fetches := consumer.PollFetches(timeout(t, 30*time.Second))
	if err := fetches.Err(); err != nil {
		t.Fatalf("read back: %v", err)
	}
	if records := fetches.Records(); len(records) != 1 || string(records[0].Value) != "v" {
		t.Fatalf("read back %v, want the committed message", records)
	}
}
