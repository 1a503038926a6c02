package postgres_test

import (
	"os"
	"testing"

	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(pgtest.Run(m))) }
