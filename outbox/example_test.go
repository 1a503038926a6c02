package outbox_test

import (
	"fmt"

	"github.com/goharvest/goharvest/outbox"
)

// The statements that create an outbox table, its notification trigger and its dead-letter
// table, where they are missing: what postgres.CreateOutboxTable and reaper init run.
func ExampleTableDDL() {
	ddl, err := outbox.TableDDL("outbox")
	if err != nil {
		panic(err)
	}
	fmt.Println(ddl)
	// Output:
	// CREATE TABLE IF NOT EXISTS "outbox" (
	//   id                  BIGSERIAL PRIMARY KEY,
	//   create_time         TIMESTAMP WITH TIME ZONE NOT NULL,
	//   kafka_topic         VARCHAR(249) NOT NULL,
	//   kafka_key           VARCHAR(100) NOT NULL,  -- pick your own maximum key size
	//   kafka_value         VARCHAR(10000),         -- pick your own maximum value size
	//   kafka_header_keys   TEXT[] NOT NULL,
	//   kafka_header_values TEXT[] NOT NULL,
	//   leader_id           UUID
	// ) WITH (fillfactor = 80);
	// CREATE OR REPLACE FUNCTION goharvest_notify() RETURNS trigger LANGUAGE plpgsql AS $fn$
	// BEGIN
	//   PERFORM pg_notify(TG_ARGV[0], '');
	//   RETURN NULL;
	// END
	// $fn$;
	// DO $do$
	// BEGIN
	//   IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '"outbox"'::regclass AND tgname = 'goharvest_notify') THEN
	//     CREATE TRIGGER goharvest_notify AFTER INSERT ON "outbox" FOR EACH STATEMENT EXECUTE FUNCTION goharvest_notify('goharvest.outbox');
	//   END IF;
	// END
	// $do$;
	// CREATE TABLE IF NOT EXISTS "outbox_dead_letters" (
	//   LIKE "outbox",
	//   error              TEXT NOT NULL,
	//   attempts           INTEGER NOT NULL,
	//   first_failure_time TIMESTAMP WITH TIME ZONE NOT NULL,
	//   last_failure_time  TIMESTAMP WITH TIME ZONE NOT NULL,
	//   dead_letter_time   TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
	//   PRIMARY KEY (id)
	// )
}
