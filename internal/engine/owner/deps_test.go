package owner

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The engine imports no driver: it builds without cgo, and neither it, its seams nor the contract
// suites depend on pgx, confluent-kafka-go, neli (which wraps confluent-kafka-go) or the root
// package (which binds them all), so that its tests run with no gcc, no librdkafka and no
// Postgres (`CGO_ENABLED=0 go test ./internal/engine/owner ./internal/engine/epoch`, as make test does).
func TestEngineImportsNoDriver(t *testing.T) {
	engine := []string{"./", "../epoch", "../../../driver", "../../../driver/memory", "../../../driver/drivertest", "../../../event"}
	build := exec.Command("go", append([]string{"build", "-o", os.DevNull}, engine...)...)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build of the engine: %v\n%s", err, out)
	}
	out, err := exec.Command("go", append([]string{"list", "-deps"}, engine...)...).Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"github.com/jackc/pgx", "github.com/confluentinc/confluent-kafka-go", "github.com/goharvest/goharvest/neli",
		} {
			if strings.HasPrefix(dep, banned) || dep == "github.com/goharvest/goharvest" {
				t.Errorf("the engine depends on %s", dep)
			}
		}
	}
}
