package stasher_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A service that only writes outbox rows needs neither cgo nor the harvester's dependencies: the
// stasher builds without cgo, and imports no Kafka client, metrics, tracing SDK or YAML.
func TestStasherNeedsNoCgoNorHarvester(t *testing.T) {
	build := exec.Command("go", "build", "-o", os.DevNull, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build ./stasher: %v\n%s", err, out)
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, banned := range []string{
			"github.com/confluentinc/confluent-kafka-go", "github.com/prometheus/", "go.opentelemetry.io/otel/sdk",
			"go.yaml.in/yaml", "gopkg.in/yaml", "github.com/goharvest/goharvest/neli",
		} {
			if strings.HasPrefix(dep, banned) || dep == "github.com/goharvest/goharvest" {
				t.Errorf("the stasher depends on %s", dep)
			}
		}
	}
}
