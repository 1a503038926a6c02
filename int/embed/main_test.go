// Package embed_test tests the harvester as a Go program embeds it, on a real Postgres and Apache
// Kafka: claims, notes and resumed commits, messages, poolers, privileges, shards and liveness.
package embed_test

import (
	"os"
	"testing"

	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

func TestMain(m *testing.M) {
	resumeCommitIfChild() // TestResumingACommitWithNoTimeLeftKeepsTheProcess runs a producer in a child process
	os.Exit(leakcheck.After(pgtest.Run(kafkacluster.Around(m))))
}
