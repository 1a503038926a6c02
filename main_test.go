package goharvest_test

import (
	"os"
	"testing"

	"github.com/goharvest/goharvest/internal/kafkatest"
	"github.com/goharvest/goharvest/internal/pgtest"
)

// exampleDataSource is an empty database for the examples.
var exampleDataSource string

func TestMain(m *testing.M) {
	kafkatest.ServeIfChild() // benchmarks run their broker in a child process
	os.Exit(pgtest.RunWithDatabase(m, func(dsn string) error {
		exampleDataSource = dsn
		return nil
	}))
}
