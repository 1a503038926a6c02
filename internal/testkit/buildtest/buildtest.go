// Package buildtest builds the module's commands for tests that run them as processes.
package buildtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex
	built = map[string]string{} // by import path and environment
)

// Binary builds the command at importPath (once per test binary) and returns its path.
func Binary(tb testing.TB, importPath string) string { return build(tb, importPath) }

// BinaryWithoutCgo builds the command at importPath with CGO_ENABLED=0, as on a machine without a
// C compiler (once per test binary), and returns its path.
func BinaryWithoutCgo(tb testing.TB, importPath string) string {
	return build(tb, importPath, "CGO_ENABLED=0")
}

// build runs go build for importPath with env added to the test's environment.
func build(tb testing.TB, importPath string, env ...string) string {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	key := strings.Join(append([]string{importPath}, env...), " ")
	if path, ok := built[key]; ok {
		return path
	}
	dir, err := os.MkdirTemp("", "goharvest-bin-")
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(dir, filepath.Base(importPath))
	cmd := exec.Command("go", "build", "-o", path, importPath)
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatal(fmt.Errorf("%s go build %s: %v: %s", strings.Join(env, " "), importPath, err, out))
	}
	built[key] = path
	return path
}
