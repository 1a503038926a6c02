package librdkafka

import (
	"os"
	"testing"

	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
)

// The contract tests run on the package's shared Apache Kafka cluster, started at the first
// test that asks for it.
func TestMain(m *testing.M) { os.Exit(leakcheck.After(kafkacluster.Run(m))) }
