// Package leakcheck fails a package's tests when goroutines outlive them (go.uber.org/goleak).
// Tests only import it.
package leakcheck

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// Options are the goroutines every package's check ignores, each for the reason beside it. None
// so far: confluent-kafka-go's, pgx's and kfake's goroutines all end when their clients, pools
// and clusters are closed, and the tests close them. Ignore only a third-party goroutine that
// lives as long as the process and that no API stops, and say which and why here.
func Options() []goleak.Option {
	return nil
}

// Main runs the tests of a package whose TestMain has nothing else to do, then checks for leaks.
func Main(m *testing.M) { goleak.VerifyTestMain(m, Options()...) }

// After checks for leaked goroutines once tests have run, given their exit code, and returns the
// code to exit with: 1 when goroutines leaked. A failed run is not checked: a test that fails
// part-way may leave goroutines behind, and its failure already says what went wrong.
func After(code int) int {
	if code != 0 {
		return code
	}
	if err := goleak.Find(Options()...); err != nil {
		fmt.Fprintf(os.Stderr, "goleak: goroutines outlived the tests: %v\n", err)
		return 1
	}
	return code
}
