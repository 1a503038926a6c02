//go:build !cgo

package franz_test

import (
	"testing"

	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
)

// Without cgo there is no Kafka cluster to test against (package kafkacluster needs
// librdkafka): only the tests that need no broker run.
func TestMain(m *testing.M) { leakcheck.Main(m) }
