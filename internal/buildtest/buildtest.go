// Package buildtest builds the module's commands for tests that run them as processes.
package buildtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex
	built = map[string]string{}
)

// Binary builds the command at importPath (once per test binary) and returns its path.
func Binary(tb testing.TB, importPath string) string {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if path, ok := built[importPath]; ok {
		return path
	}
	dir, err := os.MkdirTemp("", "goharvest-bin-")
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(dir, filepath.Base(importPath))
	if out, err := exec.Command("go", "build", "-o", path, importPath).CombinedOutput(); err != nil {
		tb.Fatal(fmt.Errorf("go build %s: %v: %s", importPath, err, out))
	}
	built[importPath] = path
	return path
}
