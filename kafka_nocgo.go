//go:build !cgo

package goharvest

import (
	"fmt"

	"github.com/goharvest/goharvest/driver"
)

var errNoLibrdkafka = fmt.Errorf("KafkaClient (kafkaClient): %q needs cgo, and this program was built without it; choose %q, or build with cgo (CGO_ENABLED=1 and gcc)",
	KafkaClientLibrdkafka, KafkaClientFranz)

func librdkafkaClient(Config) (driver.Kafka, error) { return nil, errNoLibrdkafka }

func librdkafkaProblems(Config) []error { return []error{errNoLibrdkafka} }
