package postgres_test

import (
	"context"
	"github.com/goharvest/goharvest/driver/postgres"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	outboxpkg "github.com/goharvest/goharvest/outbox"
)

// Mark reads bytea, json and jsonb columns as the bytes Kafka is to get, NULLs included, in
// pgx's binary results and in the text results of the simple protocol (which poolers may
// require).
func TestMarkReadsBytesAndJSON(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []string{"", "simple_protocol"} {
		t.Run("mode="+mode, func(t *testing.T) {
			dsn := pgtest.NewDatabase(t)
			if err := postgres.CreateOutboxTable(ctx, dsn, "outbox", outboxpkg.TableOptions{Bytea: true}); err != nil {
				t.Fatal(err)
			}
			conn, err := pgx.Connect(ctx, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			_, err = conn.Exec(ctx, `ALTER TABLE outbox ADD COLUMN j jsonb, ADD COLUMN js json;
				INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values, j, js) VALUES
				(now(), 't', '\x00ff'::bytea, '\x0000000001deadbeef00'::bytea, '{a,b}', '{"\\x00","\\x"}', '{"b": 1, "a": [null]}', '{"b":1,  "a":2}'),
				(now(), 't', '\x'::bytea, NULL, '{}', '{}', NULL, NULL),
				(now(), 't', 'k', '\x'::bytea, '{}', '{}', 'null', 'null')`)
			if err != nil {
				t.Fatal(err)
			}
			want := []struct {
				key, headers string
				value        *string
			}{
				{"\x00\xff", "a=\x00 b=", goharvest.String("\x00\x00\x00\x00\x01\xde\xad\xbe\xef\x00")},
				{"", "", nil},
				{"k", "", goharvest.String("")},
			}
			jsonWant := [][2]*string{
				{goharvest.String(`{"a": [null], "b": 1}`), goharvest.String(`{"b":1,  "a":2}`)},
				{nil, nil},
				{goharvest.String("null"), goharvest.String("null")},
			}
			for _, view := range []struct{ name, def string }{
				{"outbox", ""},
				{"as_jsonb", `CREATE VIEW as_jsonb AS SELECT id, create_time, kafka_topic, kafka_key, j AS kafka_value, kafka_header_keys, kafka_header_values, leader_id FROM outbox`},
				{"as_json", `CREATE VIEW as_json AS SELECT id, create_time, kafka_topic, kafka_key, js AS kafka_value, kafka_header_keys, kafka_header_values, leader_id FROM outbox`},
			} {
				if view.def != "" {
					if _, err := conn.Exec(ctx, view.def); err != nil {
						t.Fatal(err)
					}
				}
				source := dsn
				if mode != "" {
					source += " default_query_exec_mode=" + mode
				}
				b, err := postgres.New(source, view.name)
				if err != nil {
					t.Fatal(err)
				}
				defer b.Dispose()
				if err := b.CheckSchema(ctx); err != nil {
					t.Fatal(err)
				}
				got, err := b.Mark(ctx, uuid.New(), 10)
				if err != nil {
					t.Fatal(err)
				}
				if len(got) != len(want) {
					t.Fatalf("%s: %d records, want %d", view.name, len(got), len(want))
				}
				for i, g := range got {
					if g.Err != nil {
						t.Fatalf("%s: record %d: %v", view.name, i, g.Err)
					}
					value := want[i].value
					switch view.name {
					case "as_jsonb":
						value = jsonWant[i][0]
					case "as_json":
						value = jsonWant[i][1]
					}
					var headers string
					for j, h := range g.KafkaHeaders {
						if j > 0 {
							headers += " "
						}
						headers += h.Key + "=" + h.Value
					}
					if g.KafkaKey != want[i].key || headers != want[i].headers ||
						(g.KafkaValue == nil) != (value == nil) || (value != nil && *g.KafkaValue != *value) {
						t.Errorf("%s: record %d: key %q value %q headers %q; want %q %q %q", view.name, i,
							g.KafkaKey, deref(g.KafkaValue), headers, want[i].key, deref(value), want[i].headers)
					}
				}
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<NULL>"
	}
	return *s
}
