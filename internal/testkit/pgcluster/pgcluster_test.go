package pgcluster

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

func TestWithDatabase(t *testing.T) {
	cases := map[string]string{
		"host=/tmp port=5432 dbname=postgres":      "host=/tmp port=5432 dbname=postgres dbname=x",
		"postgres://u@localhost:5432/postgres?a=b": "postgres://u@localhost:5432/x?a=b",
	}
	for in, want := range cases {
		if got := WithDatabase(in, "x"); got != want {
			t.Errorf("WithDatabase(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestStartCreateStop(t *testing.T) {
	s, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	dsn, drop, err := s.CreateDatabase()
	if err != nil || dsn == "" {
		t.Fatalf("create database: %q %v", dsn, err)
	}
	if err := drop(); err != nil {
		t.Fatal(err)
	}
	if cpu, err := s.CPUTime(); err != nil || cpu <= 0 {
		t.Errorf("CPU time %v, %v", cpu, err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Restart() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Restart did not return within 30s")
	}
	if _, _, err := s.CreateDatabase(); err != nil {
		t.Fatalf("the restarted server does not answer: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
}

func TestStartTCPServesLoopback(t *testing.T) {
	s, err := StartTCP()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	dsn, drop, err := s.CreateDatabase()
	if err != nil {
		t.Fatal(err)
	}
	defer drop()
	if !strings.Contains(dsn, "host=127.0.0.1 ") {
		t.Fatalf("DSN %q does not name the loopback address", dsn)
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var addr string
	if err := conn.QueryRow(ctx, "SELECT host(inet_server_addr())").Scan(&addr); err != nil || addr != "127.0.0.1" {
		t.Fatalf("connected to %q (%v), want a TCP connection to 127.0.0.1", addr, err)
	}
}

// A standby streams what its primary writes; when the primary crashes and the standby is
// promoted, a multi-host data source that asks for a read-write server reaches it.
func TestStandbyPromotedAfterCrash(t *testing.T) {
	primary, err := StartPrimary()
	if err != nil {
		t.Fatal(err)
	}
	defer primary.Stop()
	standby, err := primary.StartStandby("standby1")
	if err != nil {
		t.Fatal(err)
	}
	defer standby.Stop()
	dsn, _, err := primary.CreateDatabase()
	if err != nil {
		t.Fatal(err)
	}
	db := DatabaseName(dsn)
	multi := MultiHostDSN(db, primary, standby)
	ctx := context.Background()
	exec := func(dsn, sql string) error { return Exec(ctx, dsn, sql) }
	if err := exec(multi, "CREATE TABLE t (n int); INSERT INTO t VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	onStandby := WithDatabase(standby.AdminDSN(), db)
	if !testwait.Until(30*time.Second, func() bool { return exec(onStandby, "SELECT 1/count(*) FROM t") == nil }) {
		t.Fatal("the standby did not replay the primary's row within 30s")
	}
	if err := exec(onStandby, "INSERT INTO t VALUES (2)"); err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("a write on the standby returned %v, want a read-only error", err)
	}
	if err := primary.Crash(); err != nil {
		t.Fatal(err)
	}
	if err := standby.Promote(); err != nil {
		t.Fatal(err)
	}
	if err := exec(multi, "INSERT INTO t VALUES (3)"); err != nil {
		t.Fatalf("the multi-host data source did not reach the promoted standby: %v", err)
	}
	if err := primary.Stop(); err != nil {
		t.Fatalf("stop the crashed primary: %v", err)
	}
}
