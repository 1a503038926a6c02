package pgbouncer_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/pgbouncer"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(pgtest.Run(m))) }

// Through a session pool a connection keeps its server session; through a transaction pool a
// session setting made outside a transaction is gone (or belongs to another client) by the next
// statement, once another client has used the server.
func TestPoolModes(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	for _, c := range []struct {
		mode     string
		wantKept bool
	}{{pgbouncer.Session, true}, {pgbouncer.Transaction, false}} {
		t.Run(c.mode, func(t *testing.T) {
			b, err := pgbouncer.Start(dsn, c.mode, "default_pool_size = 1")
			if err != nil {
				t.Fatal(err)
			}
			defer b.Stop()
			conn, err := pgx.Connect(ctx, b.DSN(dsn))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if _, err := conn.Exec(ctx, "SET work_mem = '7MB'"); err != nil {
				t.Fatal(err)
			}
			if c.mode == pgbouncer.Transaction {
				// Another client takes the only server connection and resets its session.
				other, err := pgx.Connect(ctx, b.DSN(dsn))
				if err != nil {
					t.Fatal(err)
				}
				if _, err := other.Exec(ctx, "RESET ALL"); err != nil {
					t.Fatal(err)
				}
				other.Close(ctx)
			}
			var name string
			if err := conn.QueryRow(ctx, "SHOW work_mem", pgx.QueryExecModeSimpleProtocol).Scan(&name); err != nil {
				t.Fatal(err)
			}
			if kept := name == "7MB"; kept != c.wantKept {
				t.Errorf("work_mem %q through a %s pool; want kept=%v", name, c.mode, c.wantKept)
			}
			if err := b.Admin(ctx, "SHOW POOLS"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// A database setting applies to every server connection PgBouncer opens.
func TestDatabaseSetting(t *testing.T) {
	dsn := pgtest.NewDatabase(t)
	ctx := context.Background()
	b, err := pgbouncer.Start(dsn, pgbouncer.Transaction, pgbouncer.DatabaseSetting+"connect_query='SET plan_cache_mode = force_generic_plan'")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Stop()
	conn, err := pgx.Connect(ctx, b.DSN(dsn))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var mode string
	if err := conn.QueryRow(ctx, "SHOW plan_cache_mode", pgx.QueryExecModeSimpleProtocol).Scan(&mode); err != nil {
		t.Fatal(err)
	}
	if mode != "force_generic_plan" {
		t.Errorf("plan_cache_mode %q through the pooler; want force_generic_plan", mode)
	}
}
