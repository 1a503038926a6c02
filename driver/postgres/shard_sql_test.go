package postgres_test

import (
	"context"
	"fmt"
	"github.com/goharvest/goharvest/driver/postgres"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	goutbox "github.com/goharvest/goharvest/outbox"
)

// A key's shard must be the same whether the harvester computes it in Go or Postgres computes it
// for the shard index and the mark: otherwise a harvester would publish rows of a shard it does
// not lead, or none would publish them. Keys are random: text of any Unicode (Postgres text holds
// no NUL) and bytes of any value, NUL included.
func TestShardSQLAgreesWithShard(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rnd := rand.New(rand.NewPCG(18, 18))
	const keys = 10_000
	texts, bytes := make([]string, keys), make([][]byte, keys)
	for i := range keys {
		texts[i], bytes[i] = randomText(rnd), randomBytes(rnd)
	}
	for _, shards := range []int{2, 3, 8, 100, goutbox.MaxShards} {
		for _, c := range []struct {
			name, typ string
			keys      any
			key       func(i int) []byte
		}{
			{"text", "text", texts, func(i int) []byte { return []byte(texts[i]) }},
			{"bytea", "bytea", bytes, func(i int) []byte { return bytes[i] }},
		} {
			rows, _ := conn.Query(ctx, fmt.Sprintf("SELECT %s FROM unnest($1::%s[]) WITH ORDINALITY AS u(k, i) ORDER BY i",
				goutbox.ShardSQL("k", shards), c.typ), c.keys)
			got, err := pgx.CollectRows(rows, pgx.RowTo[int])
			if err != nil {
				t.Fatalf("%s, %d shards: %v", c.name, shards, err)
			}
			if len(got) != keys {
				t.Fatalf("%s, %d shards: %d shards back for %d keys", c.name, shards, len(got), keys)
			}
			wrong := 0
			for i, sqlShard := range got {
				if want := goutbox.Shard(c.key(i), shards); sqlShard != want {
					if wrong++; wrong <= 5 {
						t.Errorf("%s key %q, %d shards: Postgres says shard %d, Go %d", c.name, c.key(i), shards, sqlShard, want)
					}
				}
			}
			if wrong > 0 {
				t.Errorf("%s, %d shards: %d of %d keys disagree", c.name, shards, wrong, keys)
			}
		}
	}
}

// randomText is up to 40 random Unicode characters, NUL excepted, most of them outside ASCII.
func randomText(rnd *rand.Rand) string {
	var b strings.Builder
	for range rnd.IntN(41) {
		r := rune(1 + rnd.IntN(utf8.MaxRune))
		if rnd.IntN(4) == 0 {
			r = rune(1 + rnd.IntN(127))
		}
		if !utf8.ValidRune(r) { // a surrogate half
			r = 'é'
		}
		b.WriteRune(r)
	}
	return b.String()
}

func randomBytes(rnd *rand.Rand) []byte {
	b := make([]byte, rnd.IntN(41))
	for i := range b {
		b[i] = byte(rnd.IntN(256))
	}
	return b
}

// Each shard's mark must walk the shard index, which holds only that shard's rows, in id order.
// Postgres chooses by cost, and on a table of one shard's rows among many it would rather walk
// the primary key (in the table's own order) and skip the other shards' rows, which costs the
// more the further one shard has fallen behind the others: so the test gives it such a table,
// and it checks that each shard's filter picks exactly the rows that Go assigns to the shard.
func TestShardMarkUsesShardIndex(t *testing.T) {
	const shards, rows, keys = 8, 50_000, 5_000
	for _, bytea := range []bool{false, true} {
		t.Run(fmt.Sprintf("bytea=%t", bytea), func(t *testing.T) {
			ctx := context.Background()
			dsn := pgtest.NewDatabase(t)
			if err := postgres.CreateOutboxTable(ctx, dsn, "outbox", goutbox.TableOptions{Bytea: bytea, Shards: shards}); err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			key := "'key-' || i % $1"
			if bytea {
				key = "convert_to(" + key + ", 'UTF8')"
			}
			exec := func(sql string, args ...any) {
				t.Helper()
				if _, err := conn.Exec(ctx, sql, args...); err != nil {
					t.Fatalf("%s: %v", sql, err)
				}
			}
			exec(`INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
				SELECT now(), 'events', `+key+`, NULL, '{}', '{}' FROM generate_series(0, $2 - 1) AS i`, keys, rows)
			// Every shard but the last has published its first half.
			where, _ := goutbox.ShardMarkClauses(shards, shards-1)
			exec("DELETE FROM outbox WHERE id <= $1 AND NOT ("+where+")", rows/2)
			exec("VACUUM ANALYZE outbox")

			var counted int
			for shard := range shards {
				where, _ := goutbox.ShardMarkClauses(shards, shard)
				pick, mark := postgres.ShardMarkStatements("outbox", shards, shard)
				// The subquery that picks the rows must walk the index alone. How the UPDATE
				// then finds the picked rows by id is the same as without shards: on a table this
				// small Postgres may well read it whole rather than look 500 ids up.
				if plan := explain(t, conn, pick); !strings.Contains(plan, "Index Scan using outbox_shards8 ") || strings.Contains(plan, "Seq Scan") {
					t.Errorf("shard %d's mark does not pick its rows from the shard index alone:\n%s\n%s", shard, pick, plan)
				}
				if plan := explain(t, conn, mark); !strings.Contains(plan, "Index Scan using outbox_shards8 ") {
					t.Errorf("shard %d's mark does not walk the shard index:\n%s\n%s", shard, mark, plan)
				}
				// The read strategy's query walks the same index, from the head, and hashes the ids
				// in flight once, in the plan a prepared statement ends up with too (generic).
				read := postgres.ShardReadStatement("outbox", shards, shard)
				exec("SET plan_cache_mode = force_generic_plan")
				plan := explain(t, conn, read, []int64{1, 2}, [][]byte{[]byte("held")}, 500)
				exec("RESET plan_cache_mode")
				if !strings.Contains(plan, "Index Scan using outbox_shards8 ") || strings.Contains(plan, "Seq Scan") {
					t.Errorf("shard %d's read does not walk the shard index alone:\n%s\n%s", shard, read, plan)
				}
				if !strings.Contains(plan, "hashed SubPlan") {
					t.Errorf("shard %d's read does not hash the ids it leaves out:\n%s\n%s", shard, read, plan)
				}

				rows, _ := conn.Query(ctx, "SELECT kafka_key::bytea FROM outbox WHERE "+where)
				keys, err := pgx.CollectRows(rows, pgx.RowTo[[]byte])
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range keys {
					if s := goutbox.Shard(k, shards); s != shard {
						t.Fatalf("shard %d's filter picked key %q, of shard %d", shard, k, s)
					}
				}
				counted += len(keys)
			}
			var total int
			if err := conn.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&total); err != nil {
				t.Fatal(err)
			}
			if counted != total {
				t.Errorf("the shards' filters picked %d rows of %d", counted, total)
			}
		})
	}
}

// explain returns the plan of a mark statement or its subquery ($1 a leader ID, $2 a limit).
// explain returns the plan of sql with args, or with a mark's (a leader ID and a limit).
func explain(t *testing.T, conn *pgx.Conn, sql string, args ...any) string {
	t.Helper()
	if len(args) == 0 {
		args = []any{uuid.New(), 500}
	}
	rows, _ := conn.Query(context.Background(), "EXPLAIN "+sql, args...)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n")
}

// At light load a shard holds a few live rows and its index many entries of rows purged since the
// last vacuum. Postgres, which counts only the live rows, would then find them with a bitmap scan
// and sort them, visiting the heap page of every dead entry on every claim; a shard's claim must
// walk the shard index in order instead, which stops at its limit and marks the dead entries it
// passes so that the next claim skips them. The plans are those of the batch a shard's view sends.
func TestShardClaimWalksTheIndexPastDeadRows(t *testing.T) {
	const shards = 8
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	if err := postgres.CreateOutboxTable(ctx, dsn, "outbox", goutbox.TableOptions{Shards: shards}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, sql := range []string{
		"ALTER TABLE outbox SET (autovacuum_enabled = false)",
		// 20,000 rows written and purged, 25 s at 800 records/s, and 40 left to claim.
		`INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			SELECT now(), 'events', 'key-' || i % 1000, repeat('v', 256), '{}', '{}' FROM generate_series(1, 20040) AS i`,
		"DELETE FROM outbox WHERE id <= (SELECT max(id) - 40 FROM outbox)",
		"ANALYZE outbox",
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for shard := range shards {
		_, mark := postgres.ShardMarkStatements("outbox", shards, shard)
		read := postgres.ShardReadStatement("outbox", shards, shard)
		for _, c := range []struct {
			name, sql string
			args      []any
		}{
			{"mark", mark, []any{uuid.New(), 100}},
			{"read", read, []any{[]int64{1}, [][]byte{[]byte("held")}, 100}},
		} {
			br := conn.SendBatch(ctx, postgres.ShardClaimBatch("EXPLAIN "+c.sql, c.args...))
			for range 2 {
				if _, err := br.Exec(); err != nil {
					t.Fatal(err)
				}
			}
			rows, _ := br.Query()
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if err := br.Close(); err != nil {
				t.Fatal(err)
			}
			if plan := strings.Join(lines, "\n"); !strings.Contains(plan, "Index Scan using outbox_shards8 ") || strings.Contains(plan, "Bitmap") {
				t.Errorf("shard %d's %s does not walk the shard index in order past the dead rows:\n%s", shard, c.name, plan)
			}
		}
	}
}
