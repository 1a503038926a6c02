package neli

import (
	"os"
	"testing"

	"github.com/goharvest/goharvest/internal/kafkacluster"
	"github.com/goharvest/goharvest/internal/leakcheck"
)

// The election's tests run on Apache Kafka (one cluster for the package), but for one that needs
// a fault only kfake can inject.
func TestMain(m *testing.M) { os.Exit(leakcheck.After(kafkacluster.Run(m))) }
