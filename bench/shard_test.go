package bench_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
	goutbox "github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// BenchmarkShardStorage compares the ways an outbox can let each of 8 shards' harvesters mark
// only its own rows from their head (issue 18; SHARD-STORAGE.md reports the figures and the
// choice). Each design gets a durable Postgres of its own and a backlog of 200,000 rows over
// 10,000 keys: 180,000 loaded by one INSERT ... SELECT, then 20,000 written by one writer in
// transactions of 100 rows through the stasher, timed. Then the backlog is drained as 8
// harvesters would drain it, one statement at a time so that each is timed alone: the shards
// take turns to mark 500 rows from their head, each under a leader ID of its own, and each
// shard purges a mark's rows once it has three more marks in flight (1,500 rows), so that every
// mark walks past rows in flight and past the dead tuples of earlier purges. Half way through,
// the last shard stalls, as when its harvester is gone, until the others have drained; then it
// drains too. The unsharded design is today's outbox, drained by one harvester in the same
// steps, for reference (its "stalled" half is an ordinary one).
//
//	insert-µs/row      wall time per row of the timed writer (fsync on every commit)
//	insert-pg-µs/row   Postgres's CPU per row of the timed writer
//	bulk-pg-µs/row     Postgres's CPU per row of the INSERT ... SELECT
//	mark-ms, mark-p99-ms
//	                   a mark of 500 rows while every shard drains: median, 99th percentile
//	stall-ms, stall-p99-ms
//	                   the same while one shard stalls: the others' marks start behind its rows
//	purge-ms           median purge of 500 rows (DELETE ... WHERE id = ANY($1), as the harvester)
//	drain-pg-µs/row    Postgres's CPU per row for the whole drain, marks and purges
func BenchmarkShardStorage(b *testing.B) {
	const shards = 8
	shard := goutbox.ShardSQL("kafka_key", shards)
	index, err := goutbox.ShardIndexDDL("outbox", shards)
	if err != nil {
		b.Fatal(err)
	}
	// equal filters a shard's mark with "= shard" on expr, as the obvious query would.
	equal := func(expr string) func(int) (string, string) {
		return func(s int) (string, string) { return fmt.Sprintf("%s = %d", expr, s), "id" }
	}
	partial, hashPartial := []string{}, []string{"ALTER TABLE outbox ADD COLUMN shard_hash int GENERATED ALWAYS AS (('x' || left(md5(kafka_key), 7))::bit(28)::int) STORED"}
	for s := range shards {
		partial = append(partial, fmt.Sprintf("CREATE INDEX outbox_shard%d ON outbox (id) WHERE %s = %[1]d", s, shard))
		hashPartial = append(hashPartial, fmt.Sprintf("CREATE INDEX outbox_hash_shard%[1]d ON outbox (id) WHERE shard_hash %% %[2]d = %[1]d", s, shards))
	}
	for _, d := range []shardDesign{
		{name: "unsharded", shards: 1, mark: func(int) (string, string) { return "", "id" }},
		// No index: each shard's mark walks the primary key and skips the other shards' rows.
		{name: "filter-only", shards: shards, mark: equal(shard)},
		// The index that ShardIndexDDL makes, with the obvious filter, which Postgres answers
		// by walking the primary key instead; then with ShardMarkClauses, as the harvester.
		{name: "expression-index", shards: shards, mark: equal(shard), ddl: []string{index}},
		{name: "expression-range", shards: shards, mark: func(s int) (string, string) { return goutbox.ShardMarkClauses(shards, s) }, ddl: []string{index}},
		// One index per shard, on id, over that shard's rows: Postgres always prefers it.
		{name: "partial-indexes", shards: shards, mark: equal(shard), ddl: partial},
		{name: "generated-column", shards: shards, mark: equal("shard"), ddl: []string{
			"ALTER TABLE outbox ADD COLUMN shard int GENERATED ALWAYS AS (" + shard + ") STORED",
			"CREATE INDEX outbox_shard ON outbox (shard, id)",
		}},
		// The 28-bit hash in a column, whatever the number of shards, and a partial index per
		// shard on it: a cheaper predicate for Postgres to test on each insert.
		{name: "generated-hash-partial", shards: shards, mark: equal(fmt.Sprintf("shard_hash %% %d", shards)), ddl: hashPartial},
		// Postgres refuses a generated column as a partition key, and a primary key on a table
		// partitioned by an expression, so each partition has a primary key of its own; the
		// sequence keeps ids unique across them. CreateOutboxTable then finds the table there
		// and adds the trigger and the dead-letter table. The mark names the shard in the
		// UPDATE too: without it the UPDATE would look each id up in every partition.
		{name: "partitioned", shards: shards, mark: equal(shard), outer: true, ddlFirst: partitionedOutboxDDL(shard, shards)},
	} {
		b.Run(d.name, func(b *testing.B) { benchShardStorage(b, d) })
	}
}

// shardDesign is one way to store the outbox for shards.
type shardDesign struct {
	name   string
	shards int
	// mark gives a shard's condition to AND with the mark's WHERE clause (none when empty) and
	// its ORDER BY list.
	mark     func(shard int) (where, orderBy string)
	outer    bool     // filter the UPDATE as well as its subquery
	ddlFirst []string // run before CreateOutboxTable
	ddl      []string // run after it
}

func partitionedOutboxDDL(shard string, shards int) []string {
	ddl := []string{`CREATE TABLE outbox (
  id                  BIGSERIAL,
  create_time         TIMESTAMP WITH TIME ZONE NOT NULL,
  kafka_topic         VARCHAR(249) NOT NULL,
  kafka_key           VARCHAR(100) NOT NULL,
  kafka_value         VARCHAR(10000),
  kafka_header_keys   TEXT[] NOT NULL,
  kafka_header_values TEXT[] NOT NULL,
  leader_id           UUID
) PARTITION BY LIST (` + shard + `)`}
	for s := range shards {
		ddl = append(ddl, fmt.Sprintf("CREATE TABLE outbox_%[1]d PARTITION OF outbox (PRIMARY KEY (id)) FOR VALUES IN (%[1]d) WITH (fillfactor = 80)", s))
	}
	return ddl
}

// markSQL is the harvester's mark with the design's shard filter.
func (d shardDesign) markSQL(shard int) string {
	where, order := d.mark(shard)
	var outer string
	if where != "" {
		if d.outer {
			outer = where + " AND "
		}
		where = "\n  AND " + where
	}
	return `UPDATE outbox SET leader_id = $1
WHERE ` + outer + `id IN (
  SELECT id FROM outbox
  WHERE (leader_id IS NULL OR leader_id <> $1)` + where + `
  ORDER BY ` + order + `
  LIMIT $2
)
RETURNING id, create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values, leader_id`
}

func benchShardStorage(b *testing.B, d shardDesign) {
	const (
		bulk, written, keys   = 180_000, 20_000, 10_000
		writeBatch, markBatch = 100, 500
		inFlightMarks         = 3 // per shard, before it purges its oldest
	)
	b.StopTimer()
	server, err := pgcluster.StartDurable()
	if err != nil {
		b.Fatal(err)
	}
	defer server.Stop()
	for range b.N {
		dsn, drop, err := server.CreateDatabase()
		if err != nil {
			b.Fatal(err)
		}
		ctx := context.Background()
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			b.Fatal(err)
		}
		// As the harvester's binding: an unnamed statement, planned for each execution's values.
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheDescribe
		cfg.MinConns, cfg.MaxConns = 1, 1 // one backend throughout, so that its CPU is counted
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			b.Fatal(err)
		}
		exec := func(sql string, args ...any) {
			if _, err := pool.Exec(ctx, sql, args...); err != nil {
				b.Fatalf("%s: %v", sql, err)
			}
		}
		for _, sql := range d.ddlFirst {
			exec(sql)
		}
		if err := postgres.CreateOutboxTable(ctx, dsn, "outbox", goutbox.TableOptions{}); err != nil {
			b.Fatal(err)
		}
		for _, sql := range d.ddl {
			exec(sql)
		}

		pg := mustCPU(b, server)
		exec(`INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			SELECT now(), $1, 'key-' || i % $2, repeat('v', $3), '{}', '{}' FROM generate_series(0, $4 - 1) AS i`,
			benchTopic, keys, benchValueSize, bulk)
		b.ReportMetric(float64((mustCPU(b, server)-pg).Microseconds())/bulk, "bulk-pg-µs/row")
		exec("VACUUM ANALYZE outbox")

		b.StartTimer()
		st, _ := stasher.New("outbox")
		value := strings.Repeat("v", benchValueSize)
		records := make([]goharvest.OutboxRecord, writeBatch)
		began, pg := time.Now(), mustCPU(b, server)
		for i := 0; i < written; i += writeBatch {
			for j := range records {
				records[j] = goharvest.OutboxRecord{KafkaTopic: benchTopic, KafkaKey: "key-" + strconv.Itoa((bulk+i+j)%keys), KafkaValue: &value}
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return st.StashPgx(ctx, tx, records...) }); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(time.Since(began).Microseconds())/written, "insert-µs/row")
		b.ReportMetric(float64((mustCPU(b, server)-pg).Microseconds())/written, "insert-pg-µs/row")

		marks := make([]string, d.shards)
		leaders := make([]uuid.UUID, d.shards)
		inFlight := make([][][]int64, d.shards)
		for s := range d.shards {
			marks[s], leaders[s] = d.markSQL(s), uuid.New()
		}
		var markTook, stalledTook, purgeTook []time.Duration
		purge := func(ids []int64) {
			began := time.Now()
			tag, err := pool.Exec(ctx, "DELETE FROM outbox WHERE id = ANY($1)", ids)
			purgeTook = append(purgeTook, time.Since(began))
			if err != nil || tag.RowsAffected() != int64(len(ids)) {
				b.Fatalf("purge of %d rows deleted %d: %v", len(ids), tag.RowsAffected(), err)
			}
		}
		// round has each shard but skip mark once, purging what it marked three marks ago, and
		// returns how many rows were marked; took gets the time of each mark that found rows.
		round := func(skip int, took *[]time.Duration) (marked int) {
			for s := range d.shards {
				if s == skip {
					continue
				}
				began := time.Now()
				rows, _ := pool.Query(ctx, marks[s], leaders[s], markBatch)
				ids, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (int64, error) {
					var id int64
					err := row.Scan(&id, nil, nil, nil, nil, nil, nil, nil)
					return id, err
				})
				if err != nil {
					b.Fatal(err)
				}
				if len(ids) == 0 { // a drained shard's empty marks are not what is compared
					continue
				}
				*took = append(*took, time.Since(began))
				marked += len(ids)
				inFlight[s] = append(inFlight[s], ids)
				if len(inFlight[s]) > inFlightMarks {
					purge(inFlight[s][0])
					inFlight[s] = inFlight[s][1:]
				}
			}
			return marked
		}
		pg, left := mustCPU(b, server), bulk+written
		// Half the backlog goes with every shard taking its turn; then the last shard stalls,
		// as when its harvester is gone, while the others drain; then it drains too.
		for left > (bulk+written)/2 {
			left -= round(-1, &markTook)
		}
		stalled := -1
		if d.shards > 1 {
			stalled = d.shards - 1
		}
		logScans(b, pool, "EXPLAIN "+marks[0], leaders[0], markBatch)
		for n := -1; n != 0; left -= n {
			n = round(stalled, &stalledTook)
		}
		for left > 0 {
			left -= round(-1, &markTook)
		}
		for s := range inFlight {
			for _, ids := range inFlight[s] {
				purge(ids)
			}
		}
		b.ReportMetric(float64((mustCPU(b, server)-pg).Microseconds())/(bulk+written), "drain-pg-µs/row")
		b.StopTimer()
		b.ReportMetric(medianMillis(purgeTook), "purge-ms")
		b.ReportMetric(percentileMillis(stalledTook, 0.99), "stall-p99-ms")
		b.ReportMetric(medianMillis(stalledTook), "stall-ms")
		b.ReportMetric(percentileMillis(markTook, 0.99), "mark-p99-ms")
		b.ReportMetric(medianMillis(markTook), "mark-ms")
		pool.Close()
		if err := drop(); err != nil {
			b.Fatal(err)
		}
	}
}

// logScans logs the scans of a plan: which index, if any, a design's mark walks.
func logScans(b *testing.B, pool *pgxpool.Pool, explain string, args ...any) {
	rows, _ := pool.Query(context.Background(), explain, args...)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range lines {
		if strings.Contains(line, "Scan") {
			b.Log(strings.TrimSpace(line))
		}
	}
}
