package kafkacluster

import (
	"os"
	"testing"

	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(Run(m))) }
