package stasher_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/pgbouncer"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/stasher"
)

// tricky values: quotes, backslashes and what would end a literal that was not escaped.
var tricky = []goharvest.OutboxRecord{
	{KafkaTopic: "t", KafkaKey: `it's`, KafkaValue: goharvest.String(`'); DROP TABLE outbox; --`)},
	{KafkaTopic: "t", KafkaKey: `back\`, KafkaValue: goharvest.String(`\'; SELECT 1; --`),
		KafkaHeaders: goharvest.KafkaHeaders{{Key: `'"\`, Value: `E'\\x'`}}},
}

// Through PgBouncer in transaction mode, with fewer server connections than writers so that
// their transactions share server sessions, every way of stashing works with the drivers'
// default settings: database/sql with pgx's stdlib and with lib/pq (Stash and PreStash), and
// pgx (a transaction, and a pool outside any transaction). Before, the first write failed with
// prepared statement "..." already exists (42P05) or does not exist (26000).
func TestStashThroughTransactionPooler(t *testing.T) {
	const writers, txns = 4, 15
	type writeFunc func(ctx context.Context, dsn string, st *stasher.Stasher, recs []goharvest.OutboxRecord) error
	viaSQL := func(driver string, prepared bool) writeFunc {
		return func(ctx context.Context, dsn string, st *stasher.Stasher, recs []goharvest.OutboxRecord) error {
			db, err := sql.Open(driver, dsn)
			if err != nil {
				return err
			}
			defer db.Close()
			for range txns {
				if err := sqlTx(ctx, db, st, recs, prepared); err != nil {
					return err
				}
			}
			return nil
		}
	}
	cases := []struct {
		name  string
		write writeFunc
	}{
		{"database/sql pgx Stash", viaSQL("pgx", false)},
		{"database/sql pgx PreStash", viaSQL("pgx", true)},
		{"database/sql lib/pq Stash", viaSQL("postgres", false)},
		{"database/sql lib/pq PreStash", viaSQL("postgres", true)},
		{"pgx Tx", func(ctx context.Context, dsn string, st *stasher.Stasher, recs []goharvest.OutboxRecord) error {
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			for range txns {
				if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error { return st.StashPgx(ctx, tx, recs...) }); err != nil {
					return err
				}
			}
			return nil
		}},
		{"pgxpool without a transaction", func(ctx context.Context, dsn string, st *stasher.Stasher, recs []goharvest.OutboxRecord) error {
			pool, err := pgxpool.New(ctx, dsn)
			if err != nil {
				return err
			}
			defer pool.Close()
			for range txns {
				if err := st.StashPgx(ctx, pool, recs...); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dsn := pgtest.NewOutbox(t)
			b, err := pgbouncer.Start(dsn, pgbouncer.Transaction, "default_pool_size = 2")
			if err != nil {
				t.Fatal(err)
			}
			defer b.Stop()
			st, _ := stasher.New("outbox")
			recs := append(append([]goharvest.OutboxRecord{}, sample...), tricky...)
			var wg sync.WaitGroup
			errs := make(chan error, writers)
			for range writers {
				wg.Go(func() { errs <- c.write(t.Context(), b.DSN(dsn), st, recs) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			got := readBack(t, dsn)
			if len(got) != writers*txns*len(recs) {
				t.Fatalf("%d records in the outbox, want %d", len(got), writers*txns*len(recs))
			}
			// Concurrent writers interleave their ids, so compare contents, each copy counted.
			want := map[string]int{}
			for _, r := range recs {
				want[signature(r)] += writers * txns
			}
			for _, r := range got {
				want[signature(r)]--
			}
			for sig, n := range want {
				if n != 0 {
					t.Errorf("%d copies of %s missing (negative: too many)", n, sig)
				}
			}
		})
	}
}

// signature is a record's content, for comparison.
func signature(r goharvest.OutboxRecord) string {
	value := "<nil>"
	if r.KafkaValue != nil {
		value = fmt.Sprintf("%q", *r.KafkaValue)
	}
	return fmt.Sprintf("%q %q %s %q", r.KafkaTopic, r.KafkaKey, value, r.KafkaHeaders)
}

// sqlTx stashes recs in one transaction, rolling it back on failure: a transaction left open
// would keep its server connection from the other writers.
func sqlTx(ctx context.Context, db *sql.DB, st *stasher.Stasher, recs []goharvest.OutboxRecord, prepared bool) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if !prepared {
		if err := st.Stash(ctx, tx, recs...); err != nil {
			return err
		}
		return tx.Commit()
	}
	pre, err := st.Prepare(ctx, tx)
	if err != nil {
		return err
	}
	defer pre.Close()
	for _, rec := range recs {
		if err := pre.Stash(ctx, rec); err != nil {
			return err
		}
	}
	return tx.Commit()
}
