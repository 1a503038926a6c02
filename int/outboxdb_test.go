package int

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
	"github.com/goharvest/goharvest/stasher/mysqlstasher"
)

// outboxDB is the database that holds a scenario's outbox table, "outbox": Postgres, or MySQL
// (MariaDB here) for the scenarios that run on both. The writers, the preloads and the final
// check of an empty outbox go through it, so that a scenario reads the same on either.
type outboxDB interface {
	// yaml is the harvest: lines that choose the database, beside dataSource.
	yaml() string
	// dataSource is what the reapers get as DATABASE_URL.
	dataSource() string
	// stash writes batch in one transaction, calling hold before the commit.
	stash(ctx context.Context, batch []goharvest.OutboxRecord, hold func()) error
	// rows counts the rows left in the outbox.
	rows(ctx context.Context) (int, error)
}

// postgresDB is an outbox in Postgres: the rig's pool also serves the scenarios that reach
// into Postgres itself (locks, triggers, schema changes).
type postgresDB struct {
	dsn  string
	pool *pgxpool.Pool
	st   *stasher.Stasher
}

func newPostgresDB(t *testing.T, dsn string) *postgresDB {
	t.Helper()
	if dsn == "" {
		dsn = pgtest.NewOutbox(t)
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	st, err := stasher.New("outbox")
	if err != nil {
		t.Fatal(err)
	}
	return &postgresDB{dsn: dsn, pool: pool, st: st}
}

func (d *postgresDB) yaml() string       { return "" } // the default
func (d *postgresDB) dataSource() string { return d.dsn }

func (d *postgresDB) stash(ctx context.Context, batch []goharvest.OutboxRecord, hold func()) error {
	return pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		if err := d.st.StashPgx(ctx, tx, batch...); err != nil {
			return err
		}
		hold()
		return nil
	})
}

func (d *postgresDB) rows(ctx context.Context) (int, error) {
	var n int
	err := d.pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n)
	return n, err
}

// shardIndex creates the index a sharded Postgres outbox needs.
func (d *postgresDB) shardIndex(ctx context.Context, shards int) error {
	ddl, err := outbox.ShardIndexDDL("outbox", shards)
	if err != nil {
		return err
	}
	_, err = d.pool.Exec(ctx, ddl)
	return err
}

// mysqlDB is an outbox in MySQL: a database of its own on the shared MariaDB server unless the
// scenario gives one (a server it faults).
type mysqlDB struct {
	dsn string
	db  *sql.DB
	st  *mysqlstasher.Stasher
}

func newMySQLDB(t *testing.T, dsn string) *mysqlDB {
	t.Helper()
	if dsn == "" {
		dsn = mariadbtest.NewOutbox(t)
	}
	st, err := mysqlstasher.New("outbox")
	if err != nil {
		t.Fatal(err)
	}
	return &mysqlDB{dsn: dsn, db: mariadbtest.Open(t, dsn), st: st}
}

func (d *mysqlDB) yaml() string       { return "  database: mysql\n" }
func (d *mysqlDB) dataSource() string { return d.dsn }

func (d *mysqlDB) stash(ctx context.Context, batch []goharvest.OutboxRecord, hold func()) error {
	tx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := d.st.Stash(ctx, tx, batch...); err != nil {
		tx.Rollback()
		return err
	}
	hold()
	return tx.Commit()
}

func (d *mysqlDB) rows(ctx context.Context) (int, error) {
	var n int
	err := d.db.QueryRowContext(ctx, "SELECT count(*) FROM outbox").Scan(&n)
	return n, err
}

// preloadDB writes verify.Backlog's records for keys×perKey into db in one transaction and
// returns how many each key got.
func preloadDB(t *testing.T, db outboxDB, topic, run string, keys, perKey int, value *string) map[string]int64 {
	t.Helper()
	records, expected := verify.Backlog(topic, run, keys, perKey, value)
	if err := db.stash(context.Background(), records, func() {}); err != nil {
		t.Fatal(fmt.Errorf("preload: %w", err))
	}
	return expected
}
