package stasher_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// byteaOutbox creates a database whose outbox has bytea payload columns, as reaper init -bytea
// makes it.
func byteaOutbox(t *testing.T) string {
	t.Helper()
	dsn := pgtest.NewDatabase(t)
	if err := postgres.CreateOutboxTable(context.Background(), dsn, "outbox", outbox.TableOptions{Bytea: true}); err != nil {
		t.Fatal(err)
	}
	return dsn
}

// Binary records: zero bytes, invalid UTF-8, a Schema Registry frame, a tombstone.
var binarySample = []goharvest.OutboxRecord{
	{KafkaTopic: "bin", KafkaKey: "\x00key\xff", KafkaValue: goharvest.String("\x00\x01\x02\x00"),
		KafkaHeaders: goharvest.KafkaHeaders{{Key: "h", Value: "\xc3\x28\x00"}, {Key: "empty", Value: ""}, {Key: "esc", Value: `\x41"{},`}}},
	{KafkaTopic: "bin", KafkaKey: "k", KafkaValue: goharvest.String("\x00\x00\x00\x01\x2a" + "avro\xfe\xff")},
	{KafkaTopic: "bin", KafkaKey: "", KafkaValue: nil},
	{KafkaTopic: "bin", KafkaKey: `\x41`, KafkaValue: goharvest.String(`\x41 \\ back\slash`)},
}

func TestStashBytesIntoByteaColumns(t *testing.T) {
	ctx := context.Background()
	st, err := stasher.New("outbox", stasher.ByteaColumns())
	if err != nil {
		t.Fatal(err)
	}
	for _, driver := range []string{"pgx", "postgres"} {
		for _, prepared := range []bool{false, true} {
			name := driver
			if prepared {
				name += "/prepared"
			}
			t.Run(name, func(t *testing.T) {
				dsn := byteaOutbox(t)
				db, err := sql.Open(driver, dsn)
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					t.Fatal(err)
				}
				if prepared {
					ps, err := st.Prepare(ctx, tx)
					if err != nil {
						t.Fatal(err)
					}
					for _, rec := range binarySample {
						if err := ps.Stash(ctx, rec); err != nil {
							t.Fatal(err)
						}
					}
				} else if err := st.Stash(ctx, tx, binarySample...); err != nil {
					t.Fatal(err)
				}
				if err := tx.Commit(); err != nil {
					t.Fatal(err)
				}
				sameRecords(t, readBack(t, dsn), binarySample)
			})
		}
	}
	t.Run("pgx.Tx", func(t *testing.T) {
		dsn := byteaOutbox(t)
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if err := st.StashPgx(ctx, conn, binarySample...); err != nil {
			t.Fatal(err)
		}
		sameRecords(t, readBack(t, dsn), binarySample)
	})
}

// Some columns bytea, the others text: each written in its own way.
func TestStashMixedColumns(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewOutbox(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `ALTER TABLE outbox ALTER COLUMN kafka_value TYPE bytea USING kafka_value::bytea`); err != nil {
		t.Fatal(err)
	}
	st, err := stasher.New("outbox", stasher.ByteaColumns(stasher.ValueColumn))
	if err != nil {
		t.Fatal(err)
	}
	want := []goharvest.OutboxRecord{{KafkaTopic: "mixed", KafkaKey: "text key", KafkaValue: goharvest.String("\x00\xff"),
		KafkaHeaders: goharvest.KafkaHeaders{{Key: "a", Value: `back\slash`}}}}
	if err := st.StashPgx(ctx, conn, want...); err != nil {
		t.Fatal(err)
	}
	sameRecords(t, readBack(t, dsn), want)
	text, _ := stasher.New("outbox")
	if err := text.StashPgx(ctx, conn, goharvest.OutboxRecord{KafkaTopic: "mixed", KafkaKey: "k", KafkaValue: goharvest.String(`\x41`)}); err == nil {
		t.Fatal("a text value went into a bytea column (where its backslash would be read as an escape)")
	}

	if _, err := stasher.New("outbox", stasher.ByteaColumns("kafka_topic")); err == nil {
		t.Fatal("ByteaColumns accepted kafka_topic")
	}
}

// A stasher that writes text into bytea columns would have backslashes read as escapes; the
// write is refused instead, whatever the driver.
func TestStashTextIntoByteaColumnsIsRefused(t *testing.T) {
	ctx := context.Background()
	st, _ := stasher.New("outbox")
	for _, driver := range []string{"pgx", "postgres"} {
		t.Run(driver, func(t *testing.T) {
			dsn := byteaOutbox(t)
			db, err := sql.Open(driver, dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			err = st.Stash(ctx, db, goharvest.OutboxRecord{KafkaTopic: "t", KafkaKey: "k", KafkaValue: goharvest.String(`\x41`)})
			if err == nil {
				t.Fatalf("stored a text record in bytea columns: %+v", readBack(t, dsn))
			}
			t.Log(err)
		})
	}
}

// A json or jsonb value column takes records from a stasher with JSONValue, and refuses text.
func TestStashJSONValues(t *testing.T) {
	ctx := context.Background()
	for _, typ := range []string{"json", "jsonb"} {
		t.Run(typ, func(t *testing.T) {
			dsn := pgtest.NewOutbox(t)
			db, err := sql.Open("postgres", dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			if _, err := db.Exec(`ALTER TABLE outbox ALTER COLUMN kafka_value TYPE ` + typ + ` USING NULL`); err != nil {
				t.Fatal(err)
			}
			text, _ := stasher.New("outbox")
			if err := text.Stash(ctx, db, goharvest.OutboxRecord{KafkaTopic: "j", KafkaKey: "k", KafkaValue: goharvest.String(`{"a":1}`)}); err == nil {
				t.Fatal("a text value went into a json column")
			}
			st, _ := stasher.New("outbox", stasher.JSONValue())
			if err := st.Stash(ctx, db, goharvest.OutboxRecord{KafkaTopic: "j", KafkaKey: "k", KafkaValue: goharvest.String(`not json`)}); err == nil {
				t.Fatal("a value that is not JSON went into a json column")
			}
			in := []goharvest.OutboxRecord{{KafkaTopic: "j", KafkaKey: "k", KafkaValue: goharvest.String(`{"b":[1,"\u00e9"],"a":null}`)},
				{KafkaTopic: "j", KafkaKey: "k", KafkaValue: nil}}
			if err := st.Stash(ctx, db, in...); err != nil {
				t.Fatal(err)
			}
			want := `{"b":[1,"\u00e9"],"a":null}` // json keeps the text as written
			if typ == "jsonb" {
				want = `{"a": null, "b": [1, "é"]}` // jsonb's own rendering
			}
			sameRecords(t, readBack(t, dsn), []goharvest.OutboxRecord{{KafkaTopic: "j", KafkaKey: "k", KafkaValue: &want}, in[1]})
		})
	}
}
