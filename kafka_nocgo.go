//go:build !cgo

package goharvest

import (
	"errors"
	"fmt"

	"github.com/goharvest/goharvest/driver"
)

// errNoKafkaClient: the default client, librdkafka's, needs cgo.
var errNoKafkaClient = errors.New("no Kafka client: the default one (librdkafka) needs cgo, and this build has none; set Config.Kafka to a client (see package driver)")

func defaultKafka(Config) (driver.Kafka, error) { return nil, errNoKafkaClient }

func defaultKafkaProblems(Config) []error {
	return []error{fmt.Errorf("Kafka (-): %w", errNoKafkaClient)}
}
