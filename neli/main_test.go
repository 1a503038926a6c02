package neli

import (
	"os"
	"testing"

	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
)

// The election's tests run on Apache Kafka: one cluster for the package, and clusters of their
// own for the tests that restart a broker or need ACLs.
func TestMain(m *testing.M) { os.Exit(leakcheck.After(kafkacluster.Run(m))) }
