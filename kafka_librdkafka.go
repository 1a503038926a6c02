//go:build cgo

package goharvest

import (
	"strings"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/librdkafka"
)

// librdkafkaClient is the librdkafka client with BaseKafkaConfig and ProducerKafkaConfig.
func librdkafkaClient(c Config) (driver.Kafka, error) {
	return librdkafka.New(c.librdkafkaConfig()), nil
}

func (c Config) librdkafkaConfig() librdkafka.Config {
	return librdkafka.Config{Properties: c.BaseKafkaConfig, ProducerProperties: c.ProducerKafkaConfig}
}

// librdkafkaProblems are the librdkafka client's refusals of BaseKafkaConfig and
// ProducerKafkaConfig, each naming its field and key.
func librdkafkaProblems(c Config) []error {
	var errs []error
	for _, p := range c.librdkafkaConfig().Problems(c.Limits.QueueTimeout) {
		errs = append(errs, propertyProblem(p.Producer, p.Property, p.Reason))
	}
	if s, _ := c.BaseKafkaConfig["bootstrap.servers"].(string); strings.TrimSpace(s) == "" {
		errs = append(errs, propertyProblem(false, "bootstrap.servers", "must name at least one host:port"))
	}
	return errs
}
