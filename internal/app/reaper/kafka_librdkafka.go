//go:build cgo

package reaper

import (
	"strings"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/librdkafka"
)

// librdkafkaClient is the librdkafka client with the settings' property maps, and the
// properties it refuses, each naming its field and key.
func librdkafkaClient(s Settings) (driver.Kafka, []error) {
	cfg := librdkafka.Config{Properties: s.BaseKafkaConfig, ProducerProperties: s.ProducerKafkaConfig}
	var errs []error
	for _, p := range cfg.Problems(s.Limits.QueueTimeout) {
		errs = append(errs, propertyProblem(p.Producer, p.Property, p.Reason))
	}
	if servers, _ := s.BaseKafkaConfig["bootstrap.servers"].(string); strings.TrimSpace(servers) == "" {
		errs = append(errs, propertyProblem(false, "bootstrap.servers", "must name at least one host:port"))
	}
	return librdkafka.New(cfg), errs
}
