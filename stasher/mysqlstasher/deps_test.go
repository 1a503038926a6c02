package mysqlstasher_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A service that writes a MySQL outbox needs neither cgo nor any of the harvester: the stasher
// builds without cgo and imports no database driver (the service picks its own), no Postgres
// client, and nothing of goharvest but package outbox.
func TestStasherNeedsNoCgoNorDrivers(t *testing.T) {
	build := exec.Command("go", "build", "-o", os.DevNull, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build: %v\n%s", err, out)
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(out)) {
		switch dep {
		case "github.com/goharvest/goharvest/stasher/mysqlstasher", "github.com/goharvest/goharvest/outbox",
			"github.com/google/uuid": // outbox.Record's LeaderID
		default:
			t.Errorf("the stasher depends on %s", dep)
		}
	}
}
