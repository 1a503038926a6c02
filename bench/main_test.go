// Package bench_test holds the benchmarks behind make bench (docs/performance.md): the harvester
// on a throwaway Postgres and Apache Kafka, beside the plain idempotent producer it is measured
// against, and idle outboxes in one reaper process.
package bench_test

import (
	"os"
	"testing"

	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

func TestMain(m *testing.M) {
	kafkatest.ServeIfChild() // benchmarks run their broker in a child process
	serveHarvesterIfChild()  // and BenchmarkDrainShards a second harvester
	os.Exit(leakcheck.After(pgtest.Run(kafkacluster.Around(m))))
}
