package reaper

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

// reaper init makes the text table by default and the bytea one with -bytea.
func TestInitCreatesTextOrByteaTable(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"init"}, "kafka_header_values text[], kafka_key character varying, kafka_value character varying"},
		{[]string{"init", "-bytea"}, "kafka_header_values bytea[], kafka_key bytea, kafka_value bytea"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			conn := initDatabase(t, "", c.args, "is ready")
			var got string
			err := conn.QueryRow(context.Background(), `SELECT string_agg(attname || ' ' || format_type(atttypid, NULL), ', ' ORDER BY attname)
				FROM pg_attribute WHERE attrelid = 'outbox'::regclass AND attname IN ('kafka_key', 'kafka_value', 'kafka_header_values')`).Scan(&got)
			if err != nil {
				t.Fatal(err)
			}
			if got != c.want {
				t.Fatalf("columns %q, want %q", got, c.want)
			}
		})
	}
}

// With harvest.shards, reaper init also creates the index each shard's mark walks.
func TestInitCreatesTheShardIndex(t *testing.T) {
	conn := initDatabase(t, "  shards: 8\n", []string{"init"}, "index for 8 shards")
	var def string
	if err := conn.QueryRow(context.Background(), `SELECT indexdef FROM pg_indexes WHERE tablename = 'outbox' AND indexname = 'outbox_shards8'`).Scan(&def); err != nil {
		t.Fatalf("no shard index: %v", err)
	}
	if !strings.Contains(def, "md5") || !strings.Contains(def, "% 8") {
		t.Fatalf("shard index %q does not index the shard of 8", def)
	}
}

// initDatabase runs the reaper with args (and extra harvest settings) against a new database,
// checks that it succeeded saying want, and returns a connection to the database.
func initDatabase(t *testing.T, harvest string, args []string, want string) *pgx.Conn {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	code, stdout, stderr := run(t, "harvest:\n  dataSource: "+dsn+"\n  leaderGroupID: g\n  leaderTopic: t\n"+harvest, args...)
	if code != ExitOK || !strings.Contains(stdout, want) {
		t.Fatalf("exit %d: %s%s", code, stdout, stderr)
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
