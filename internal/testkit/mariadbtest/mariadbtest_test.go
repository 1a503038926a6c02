package mariadbtest

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(Run(m))) }

// Two tests' databases are empty and separate: a table made in one is not in the other.
func TestNewDatabaseIsEmptyAndSeparate(t *testing.T) {
	ctx := context.Background()
	first, second := NewDatabase(t), NewDatabase(t)
	if first == second {
		t.Fatalf("two tests got the same database: %s", first)
	}
	if _, err := Open(t, first).ExecContext(ctx, "CREATE TABLE only_here (id INT)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := Open(t, second).QueryRowContext(ctx,
		"SELECT count(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'only_here'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatal("a table created in one test's database is visible in another's")
	}
}

// A throwaway server is gone once stopped: its process has exited and its directory is removed.
func TestStopKillsTheServerAndRemovesItsDirectory(t *testing.T) {
	if os.Getenv(EnvDSN) != "" {
		t.Skip("an existing server is not stopped")
	}
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	pid, dir := s.cmd.Process.Pid, s.dir
	if _, err := Open(t, s.AdminDSN()).Exec("SELECT 1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("mariadbd (pid %d) still runs after Stop", pid)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the server's directory %s is still there after Stop: %v", dir, err)
	}
	if err := s.Stop(); err != nil {
		t.Errorf("a second Stop: %v", err)
	}
}

// A durable server keeps a committed row through a crash and a clean restart, answers on the same
// address after each, and runs with the binary log on or off as asked.
func TestDurableServerKeepsCommitsThroughRestarts(t *testing.T) {
	if os.Getenv(EnvDSN) != "" {
		t.Skip("an existing server is not restarted")
	}
	for _, binlog := range []bool{true, false} {
		s, err := Start(Durable(binlog), LockWaitTimeout(3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Stop() })
		ctx := context.Background()
		db := Open(t, s.AdminDSN())
		db.SetMaxIdleConns(0) // a fresh connection after each restart
		for _, statement := range []string{"CREATE DATABASE kept", "CREATE TABLE kept.t (id INT PRIMARY KEY)", "INSERT INTO kept.t VALUES (1)"} {
			if _, err := db.ExecContext(ctx, statement); err != nil {
				t.Fatal(err)
			}
		}
		for _, crash := range []bool{true, false} {
			if err := s.Restart(crash); err != nil {
				t.Fatalf("restart (crash %v): %v", crash, err)
			}
			var n int
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM kept.t").Scan(&n); err != nil || n != 1 {
				t.Fatalf("after a restart (crash %v), %d rows (%v), want the 1 committed", crash, n, err)
			}
		}
		var logBin bool
		var lockWait int
		if err := db.QueryRowContext(ctx, "SELECT @@log_bin, @@innodb_lock_wait_timeout").Scan(&logBin, &lockWait); err != nil {
			t.Fatal(err)
		}
		if logBin != binlog || lockWait != 3 {
			t.Errorf("log_bin %v, innodb_lock_wait_timeout %d; want %v, 3", logBin, lockWait, binlog)
		}
	}
}
