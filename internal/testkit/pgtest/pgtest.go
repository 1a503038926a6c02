// Package pgtest gives tests a real PostgreSQL server.
//
// When GOHARVEST_TEST_DSN is set, tests use that server. Otherwise the first test that asks for a
// database starts a throwaway cluster (see package pgcluster). Every test gets a database of its
// own (NewDatabase), so tests and packages can run in parallel. A package that uses pgtest calls
// Run from its TestMain so that the cluster is stopped at the end:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }
package pgtest

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
	"github.com/goharvest/goharvest/outbox"
)

// EnvDSN names the environment variable that points the tests at an existing server. The role
// it names must be allowed to create databases.
const EnvDSN = "GOHARVEST_TEST_DSN"

// Server is the server the tests use.
type Server = pgcluster.Server

var (
	startOnce sync.Once
	server    *Server
	startErr  error
)

// Runner is what Run runs: a *testing.M, or a wrapper that prepares something first.
type Runner interface{ Run() int }

// Run runs the package's tests and then stops the throwaway cluster, if one was started. It
// returns the exit code for os.Exit.
func Run(m Runner) int {
	code := m.Run()
	if server != nil {
		if err := server.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
		}
	}
	return code
}

// RunWithDatabase is Run for a package whose examples need a database: before the tests run it
// creates one and passes its DSN to setup (which creates tables and stores the DSN for the
// examples); afterwards it drops it and stops the cluster.
func RunWithDatabase(m Runner, setup func(dsn string) error) int {
	return Run(runnerFunc(func() int {
		s, err := Get()
		if err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			return 1
		}
		dsn, drop, err := s.CreateDatabase()
		if err != nil {
			fmt.Fprintln(os.Stderr, "pgtest:", err)
			return 1
		}
		defer drop()
		if err := setup(dsn); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: setup:", err)
			return 1
		}
		return m.Run()
	}))
}

type runnerFunc func() int

func (f runnerFunc) Run() int { return f() }

// Shared returns the server the tests use, starting a throwaway cluster on first use. It fails
// the test when no server can be had.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	s, err := Get()
	if err != nil {
		tb.Fatalf("pgtest: start PostgreSQL: %v", err)
	}
	return s
}

// Get is Shared for code without a testing.TB, such as TestMain.
func Get() (*Server, error) {
	startOnce.Do(func() {
		if dsn := os.Getenv(EnvDSN); dsn != "" {
			server = pgcluster.Existing(dsn)
			return
		}
		server, startErr = pgcluster.Start()
	})
	return server, startErr
}

// NewDatabase creates an empty database for the calling test and returns a data source name
// (key=value or URL form, as the server's) that connects to it. The database is dropped when
// the test ends.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	dsn, drop, err := Shared(tb).CreateDatabase()
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Errorf("pgtest: %v", err)
		}
	})
	return dsn
}

// NewOutbox creates a database for the calling test, as NewDatabase does, with an outbox table
// named "outbox" in it, and returns its data source name.
func NewOutbox(tb testing.TB) string {
	tb.Helper()
	dsn := NewDatabase(tb)
	if err := postgres.CreateOutboxTable(context.Background(), dsn, "outbox", outbox.TableOptions{}); err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	return dsn
}
