package outbox

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/internal/pgname"
)

// outboxDDLTemplate creates the outbox table. There is deliberately no index on leader_id:
// marking rewrites leader_id on every row, and without an index on it Postgres can make that a
// heap-only (HOT) update, which is much cheaper. A HOT update also needs room for the new row
// version on the same page, which the fillfactor leaves; in the drain benchmark it cut Postgres's
// CPU per record by about a fifth.
const outboxDDLTemplate = `CREATE TABLE IF NOT EXISTS %[1]s (
  id                  BIGSERIAL PRIMARY KEY,
  create_time         TIMESTAMP WITH TIME ZONE NOT NULL,
  kafka_topic         VARCHAR(249) NOT NULL,
  kafka_key           %[2]s
  kafka_value         %[3]s
  kafka_header_keys   TEXT[] NOT NULL,
  kafka_header_values %[4]s NOT NULL,
  leader_id           UUID
) WITH (fillfactor = 80)`

// The payload columns' types, with the rest of their lines, for text and for bytes.
var (
	textPayloadColumns  = [3]string{"VARCHAR(100) NOT NULL,  -- pick your own maximum key size", "VARCHAR(10000),         -- pick your own maximum value size", "TEXT[]"}
	bytesPayloadColumns = [3]string{"BYTEA NOT NULL,", "BYTEA,", "BYTEA[]"}
)

// TableOptions choose how TableDDLWith (and goharvest.CreateOutboxTableWith) make the outbox
// table.
type TableOptions struct {
	// Bytea makes kafka_key and kafka_value BYTEA and kafka_header_values BYTEA[], for binary
	// payloads (Avro, Protobuf, Schema Registry framing), published byte for byte. The default
	// is text: VARCHAR key and value, TEXT[] header values. (The harvester reads either, and
	// json/jsonb values too; see README, Messages.)
	Bytea bool
}

// notifyDDLTemplate installs a statement-level trigger that sends a notification on the outbox's
// channel (see NotifyChannel) after every INSERT, so that a harvester waiting on an idle outbox
// hears of new records at once instead of at its next poll. Postgres folds the notifications of
// one transaction into one, delivered at commit. The trigger is created only if absent, so the
// statement can be run again.
const notifyDDLTemplate = `CREATE OR REPLACE FUNCTION %[1]s() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify(TG_ARGV[0], '');
  RETURN NULL;
END
$fn$;
DO $do$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '%[2]s'::regclass AND tgname = 'goharvest_notify') THEN
    CREATE TRIGGER goharvest_notify AFTER INSERT ON %[2]s FOR EACH STATEMENT EXECUTE FUNCTION %[1]s('%[3]s');
  END IF;
END
$do$`

// TableDDL returns the statements that create an outbox table with the given (optionally
// schema-qualified) name, if it does not exist, its notification trigger (see NotifyChannel) and
// its dead-letter table (see DeadLetterTable). Run them as one script; they may be run again.
func TableDDL(table string) (string, error) {
	return TableDDLWith(table, TableOptions{})
}

// TableDDLWith is TableDDL with a choice of column types.
func TableDDLWith(table string, opts TableOptions) (string, error) {
	quoted, err := pgname.QuoteTable(table)
	if err != nil {
		return "", err
	}
	// The trigger function lives in the table's schema. Names that pass QuoteTable hold no quote
	// marks, so they can go inside the SQL string literals as they are.
	function := "goharvest_notify"
	if schema, _, qualified := strings.Cut(table, "."); qualified {
		function = pgx.Identifier{schema, function}.Sanitize()
	}
	cols := textPayloadColumns
	if opts.Bytea {
		cols = bytesPayloadColumns
	}
	dead, err := pgname.QuoteTable(DeadLetterTable(table))
	if err != nil {
		return "", err
	}
	// The dead-letter table copies the outbox's columns (LIKE), bytea or text alike.
	return fmt.Sprintf(outboxDDLTemplate, quoted, cols[0], cols[1], cols[2]) + ";\n" +
		fmt.Sprintf(notifyDDLTemplate, function, quoted, NotifyChannel(table)) + ";\n" +
		fmt.Sprintf(deadLetterDDLTemplate, dead, quoted), nil
}

// NotifyChannel returns the channel on which a harvester of the outbox table listens:
// "goharvest." followed by the table's name as configured, cut to Postgres's 63-byte limit (two
// long names that then share a channel cost only a spurious wake-up). The trigger that
// TableDDL installs notifies it; a writer can also call pg_notify(channel, payload) in its
// transaction (the payload is ignored). Without notifications the harvester still finds new
// records by polling, within Limits.MaxMarkBackoff.
func NotifyChannel(table string) string {
	channel := "goharvest." + table
	return channel[:min(len(channel), 63)]
}

// DeadLetterSuffix is put after the outbox table's name to make its dead-letter table's name.
const DeadLetterSuffix = "_dead_letters"

// DeadLetterTable returns the name of the dead-letter table of an outbox table (optionally
// schema-qualified; the dead-letter table lives in the same schema): the table's name followed by
// DeadLetterSuffix, the name cut so that it stays within Postgres's 63 bytes.
func DeadLetterTable(outboxTable string) string {
	schema, table, qualified := strings.Cut(outboxTable, ".")
	if !qualified {
		schema, table = "", outboxTable
	}
	name := table[:min(len(table), 63-len(DeadLetterSuffix))] + DeadLetterSuffix
	if qualified {
		return schema + "." + name
	}
	return name
}

// deadLetterDDLTemplate creates the dead-letter table: every column of the outbox table (LIKE
// copies them as they are when it runs), then what goharvest knows of the failure. The outbox id
// is kept, as the key.
const deadLetterDDLTemplate = `CREATE TABLE IF NOT EXISTS %[1]s (
  LIKE %[2]s,
  error              TEXT NOT NULL,
  attempts           INTEGER NOT NULL,
  first_failure_time TIMESTAMP WITH TIME ZONE NOT NULL,
  last_failure_time  TIMESTAMP WITH TIME ZONE NOT NULL,
  dead_letter_time   TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
  PRIMARY KEY (id)
)`
