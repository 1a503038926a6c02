package kafkacluster

// The cluster a package's tests share: started on first use, stopped after the last test.

import (
	"os"
	"sync"
	"testing"
)

var (
	sharedOnce sync.Once
	shared     *Cluster
	sharedErr  error
	sharedFail bool
)

// EnvNodes sets how many nodes the shared cluster has (1 unless set to 3).
const EnvNodes = "GOHARVEST_KAFKA_NODES"

// Shared returns the package's shared cluster, starting it on first use; Run stops it. Tests that
// share it use topics and groups of their own.
func Shared(tb testing.TB) *Cluster {
	tb.Helper()
	c, err := getShared()
	if err != nil {
		tb.Fatalf("kafkacluster: %v", err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			sharedFail = true
		}
	})
	return c
}

// SetShared sets the options of the shared cluster, from TestMain before the tests run. Without
// it the shared cluster has one node, or three if GOHARVEST_KAFKA_NODES is 3.
func SetShared(opts ...Option) { sharedOpts = opts }

var sharedOpts []Option

func getShared() (*Cluster, error) {
	sharedOnce.Do(func() {
		opts := sharedOpts
		if opts == nil && os.Getenv(EnvNodes) == "3" {
			opts = []Option{Nodes(3)}
		}
		shared, sharedErr = New(opts...)
	})
	return shared, sharedErr
}

// Runner is what Run runs: a *testing.M, or a wrapper that prepares something first.
type Runner interface{ Run() int }

// Run runs the package's tests, then stops the shared cluster if one was started, keeping its
// logs if a test failed.
func Run(m Runner) int { return Around(m).Run() }

// Around returns a Runner that runs m and then stops the shared cluster as Run does, for a
// TestMain that wraps m in other fixtures too: pgtest.Run(kafkacluster.Around(m)).
func Around(m Runner) Runner {
	return runnerFunc(func() int {
		code := m.Run()
		if shared != nil {
			shared.Close(code != 0 || sharedFail)
		}
		return code
	})
}

type runnerFunc func() int

func (f runnerFunc) Run() int { return f() }

// SharedAddr starts the shared cluster, for code without a testing.TB (a TestMain preparing
// examples), and returns its bootstrap servers.
func SharedAddr() (string, error) {
	c, err := getShared()
	if err != nil {
		return "", err
	}
	return c.Addr(), nil
}
