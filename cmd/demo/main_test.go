package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDemoEndToEnd builds the three binaries and runs the demo as make demo does, with a small
// load, so that the README's first command stays true.
func TestDemoEndToEnd(t *testing.T) {
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+string(filepath.Separator),
		"github.com/goharvest/goharvest/cmd/reaper", "github.com/goharvest/goharvest/cmd/pump", "github.com/goharvest/goharvest/cmd/demo")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	demo := exec.Command(filepath.Join(bin, "demo"), "-bin", bin, "-records", "3000", "-keys", "100")
	demo.Env = os.Environ()
	out, err := demo.CombinedOutput()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, out)
	}
	for _, want := range []string{"verdict: OK", "records expected 3000, arrived 3000", "leader acquired", "0 rows left in the outbox"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
	// A person watching the demo sees the tools' own lines, not librdkafka's raw ones
	// (%6|1700000000.123|GETSUBSCRIPTIONS|...).
	if raw := regexp.MustCompile(`(?m)%\d\|[\d.]+\|[A-Z_]+\|.*$`).FindString(string(out)); raw != "" {
		t.Errorf("demo output holds a raw librdkafka line: %s", raw)
	}
}
