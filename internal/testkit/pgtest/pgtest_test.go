package pgtest

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(Run(m))) }

func TestNewDatabaseIsEmptyAndSeparate(t *testing.T) {
	ctx := context.Background()
	first, second := NewDatabase(t), NewDatabase(t)
	if first == second {
		t.Fatalf("two tests got the same database: %s", first)
	}
	conn, err := pgx.Connect(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE TABLE only_here (id int)"); err != nil {
		t.Fatal(err)
	}
	other, err := pgx.Connect(ctx, second)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	var n int
	if err := other.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_here'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("a table created in one test's database is visible in another's")
	}
}
