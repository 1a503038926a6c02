package goharvest_test

import (
	"os"
	"testing"

	"github.com/goharvest/goharvest/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
