package goharvest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// An embedder links only the drivers it names, with cgo on as well as off: the root package and
// the in-memory example link no Postgres or Kafka client, a program that names the Postgres
// store and the franz client links no librdkafka, and the order services link no Kafka client
// (nor, on MySQL, Postgres's).
func TestEmbedderLinksOnlyTheDriversItNames(t *testing.T) {
	const pgx, kgo, librdkafka = "github.com/jackc/pgx/v5", "github.com/twmb/franz-go/pkg/kgo", "github.com/confluentinc/confluent-kafka-go/v2/kafka"
	for pkg, refused := range map[string][]string{
		".":                       {pgx, kgo, librdkafka},
		"./examples/memory":       {pgx, kgo, librdkafka},
		"./examples/embed":        {librdkafka},
		"./examples/stasher":      {kgo, librdkafka},
		"./examples/mysqlstasher": {pgx, kgo, librdkafka},
	} {
		list := exec.Command("go", "list", "-deps", pkg)
		list.Env = append(os.Environ(), "CGO_ENABLED=1")
		out, err := list.Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		deps := strings.Fields(string(out))
		for _, r := range refused {
			if slices.Contains(deps, r) {
				t.Errorf("%s links %s, which it does not name", pkg, r)
			}
		}
	}
}
