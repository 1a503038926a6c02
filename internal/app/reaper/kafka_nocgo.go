//go:build !cgo

package reaper

import (
	"fmt"

	"github.com/goharvest/goharvest/driver"
)

var errNoLibrdkafka = fmt.Errorf("KafkaClient (kafkaClient): %q needs cgo, and this program was built without it; choose %q, or build with cgo (CGO_ENABLED=1 and gcc)",
	KafkaClientLibrdkafka, KafkaClientFranz)

func librdkafkaClient(Settings) (driver.Kafka, []error) { return nil, []error{errNoLibrdkafka} }
