package reaper

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/internal/pgtest"
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
			dsn := pgtest.NewDatabase(t)
			code, stdout, stderr := run(t, "harvest:\n  dataSource: "+dsn+"\n  leaderGroupID: g\n  leaderTopic: t\n", c.args...)
			if code != ExitOK || !strings.Contains(stdout, "is ready") {
				t.Fatalf("exit %d: %s%s", code, stdout, stderr)
			}
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			var got string
			err = conn.QueryRow(ctx, `SELECT string_agg(attname || ' ' || format_type(atttypid, NULL), ', ' ORDER BY attname)
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
