package outbox

import (
	"strings"
	"testing"
)

func TestShardIndexDDL(t *testing.T) {
	long := strings.Repeat("t", 63)
	for _, c := range []struct {
		table  string
		shards int
		want   string
	}{
		{"outbox", 8, `CREATE INDEX IF NOT EXISTS "outbox_shards8" ON "outbox" ((('x' || left(md5(kafka_key), 7))::bit(28)::int % 8), id)`},
		// The index goes in the table's schema, under an unqualified name.
		{"app.outbox", 2, `CREATE INDEX IF NOT EXISTS "outbox_shards2" ON "app"."outbox" ((('x' || left(md5(kafka_key), 7))::bit(28)::int % 2), id)`},
		// A name cut to 63 bytes keeps the suffix, so that each number of shards has its own.
		{long, MaxShards, `CREATE INDEX IF NOT EXISTS "` + long[:63-len("_shards256")] + `_shards256" ON "` + long + `" ((('x' || left(md5(kafka_key), 7))::bit(28)::int % 256), id)`},
	} {
		got, err := ShardIndexDDL(c.table, c.shards)
		if err != nil || got != c.want {
			t.Errorf("ShardIndexDDL(%q, %d) = %q, %v; want %q", c.table, c.shards, got, err, c.want)
		}
	}
	for _, c := range []struct {
		table  string
		shards int
	}{{"outbox", 1}, {"outbox", 0}, {"outbox", -1}, {"outbox", MaxShards + 1}, {"a.b.c", 8}, {`out"box`, 8}} {
		if got, err := ShardIndexDDL(c.table, c.shards); err == nil {
			t.Errorf("ShardIndexDDL(%q, %d) = %q, want an error", c.table, c.shards, got)
		}
	}
}

func TestTableDDLWithShards(t *testing.T) {
	index, _ := ShardIndexDDL("outbox", 8)
	for _, c := range []struct {
		shards    int
		wantIndex bool
	}{{0, false}, {1, false}, {8, true}} {
		ddl, err := TableDDLWith("outbox", TableOptions{Shards: c.shards})
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(ddl, "CREATE INDEX"); got != c.wantIndex {
			t.Errorf("Shards %d: an index in the DDL is %t, want %t:\n%s", c.shards, got, c.wantIndex, ddl)
		}
		if c.wantIndex && !strings.HasSuffix(ddl, ";\n"+index) {
			t.Errorf("Shards %d: the DDL does not end with the shard index %s:\n%s", c.shards, index, ddl)
		}
	}
	for _, shards := range []int{-1, MaxShards + 1} {
		if _, err := TableDDLWith("outbox", TableOptions{Shards: shards}); err == nil {
			t.Errorf("Shards %d: no error", shards)
		}
	}
}

func TestShardMarkClauses(t *testing.T) {
	where, order := ShardMarkClauses(8, 3)
	expr := `(('x' || left(md5(kafka_key), 7))::bit(28)::int % 8)`
	if want := expr + " BETWEEN 3 AND 3"; where != want {
		t.Errorf("where = %q, want %q", where, want)
	}
	// The order must begin with the expression of the index, or Postgres walks the primary key.
	if want := expr + ", id"; order != want {
		t.Errorf("orderBy = %q, want %q", order, want)
	}
	if where, order := ShardMarkClauses(1, 0); where != "" || order != "id" {
		t.Errorf("one shard: %q, %q; want no condition and id", where, order)
	}
}
