package owner

import (
	"testing"

	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }
