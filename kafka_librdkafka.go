//go:build cgo

package goharvest

import (
	"fmt"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/librdkafka"
)

// defaultKafka is the librdkafka client with BaseKafkaConfig and ProducerKafkaConfig.
func defaultKafka(c Config) (driver.Kafka, error) { return librdkafka.New(c.librdkafkaConfig()), nil }

func (c Config) librdkafkaConfig() librdkafka.Config {
	return librdkafka.Config{Properties: c.BaseKafkaConfig, ProducerProperties: c.ProducerKafkaConfig}
}

// defaultKafkaProblems are the librdkafka client's refusals of BaseKafkaConfig and
// ProducerKafkaConfig, each naming its field and key.
func defaultKafkaProblems(c Config) []error {
	var errs []error
	for _, p := range c.librdkafkaConfig().Problems(c.Limits.QueueTimeout) {
		field, key := "BaseKafkaConfig", "baseKafkaConfig."
		if p.Producer {
			field, key = "ProducerKafkaConfig", "producerKafkaConfig."
		}
		errs = append(errs, fmt.Errorf("%s (%s%s): %s", field, key, p.Property, p.Reason))
	}
	return errs
}
