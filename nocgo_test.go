package goharvest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A program that embeds the harvester with the in-memory driver (examples/memory) builds and
// runs with CGO_ENABLED=0: the root package needs no cgo, and only the librdkafka client does.
func TestEmbeddingBuildsAndRunsWithoutCgo(t *testing.T) {
	env := append(os.Environ(), "CGO_ENABLED=0")
	list := exec.Command("go", "list", "-deps", ".", "./examples/memory")
	list.Env = env
	deps, err := list.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	for _, dep := range strings.Fields(string(deps)) {
		if strings.HasPrefix(dep, "github.com/confluentinc/") || dep == "github.com/goharvest/goharvest/driver/librdkafka" {
			t.Errorf("without cgo, the root package or examples/memory depends on %s", dep)
		}
	}
	bin := filepath.Join(t.TempDir(), "memory")
	build := exec.Command("go", "build", "-o", bin, "./examples/memory")
	build.Env = env
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build ./examples/memory: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "published 1000 records of 10 keys in order, without cgo") {
		t.Fatalf("examples/memory: %v\n%s", err, out)
	}
}
