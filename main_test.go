package goharvest_test

import (
	"os"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/goharvest/goharvest/internal/kafkatest"
	"github.com/goharvest/goharvest/internal/leakcheck"
	"github.com/goharvest/goharvest/internal/pgtest"
)

// For the examples: an empty database and an in-process Kafka-protocol broker.
var (
	exampleDataSource       string
	exampleBootstrapServers string
)

func TestMain(m *testing.M) {
	kafkatest.ServeIfChild() // benchmarks run their broker in a child process
	serveHarvesterIfChild()  // and BenchmarkDrainShards a second harvester
	var broker *kfake.Cluster
	code := pgtest.RunWithDatabase(m, func(dsn string) error {
		exampleDataSource = dsn
		var err error
		broker, err = kfake.NewCluster(kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(),
			kfake.DefaultNumPartitions(1), kfake.GroupMinSessionTimeout(100*time.Millisecond))
		if err != nil {
			return err
		}
		exampleBootstrapServers = broker.ListenAddrs()[0]
		return nil
	})
	if broker != nil {
		broker.Close() // before the leak check, which would count its goroutines
	}
	os.Exit(leakcheck.After(code))
}
