package mysql_test

import (
	"os"
	"testing"

	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(mariadbtest.Run(m))) }
