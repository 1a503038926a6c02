package goharvest_test

import (
	"os"
	"testing"

	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

// TestMain gives the examples' settings (exampleDataSource, exampleBootstrapServers, declared in
// example_test.go) an empty database and Apache Kafka (the package's shared cluster).
func TestMain(m *testing.M) {
	code := pgtest.RunWithDatabase(kafkacluster.Around(m), func(dsn string) error {
		exampleDataSource = dsn
		var err error
		exampleBootstrapServers, err = kafkacluster.SharedAddr()
		return err
	})
	os.Exit(leakcheck.After(code))
}
