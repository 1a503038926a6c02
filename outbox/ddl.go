package outbox

import (
	"fmt"
	"strconv"
	"strings"
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

// DefaultTable is the outbox table's name where none is given (the reaper's outboxTable).
const DefaultTable = "outbox"

// TableOptions choose how TableDDLWith (and goharvest.CreateOutboxTableWith) make the outbox
// table.
type TableOptions struct {
	// Bytea makes kafka_key and kafka_value BYTEA and kafka_header_values BYTEA[], for binary
	// payloads (Avro, Protobuf, Schema Registry framing), published byte for byte. The default
	// is text: VARCHAR key and value, TEXT[] header values. (The harvester reads either, and
	// json/jsonb values too; see docs/messages.md.)
	Bytea bool
	// Shards, when 2 or more, adds the index that each shard's mark walks (see ShardIndexDDL).
	// The default, 0, and 1 add none: one harvester walks the primary key.
	Shards int
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
	quoted, err := QuoteTable(table)
	if err != nil {
		return "", err
	}
	// The trigger function lives in the table's schema. Names that pass QuoteTable hold no quote
	// marks, so they can go inside the SQL string literals as they are.
	function := "goharvest_notify"
	if schema, _, qualified := strings.Cut(table, "."); qualified {
		function = quoteName(schema, function)
	}
	cols := textPayloadColumns
	if opts.Bytea {
		cols = bytesPayloadColumns
	}
	dead, err := QuoteTable(DeadLetterTable(table))
	if err != nil {
		return "", err
	}
	var shardIndex string
	if opts.Shards > 1 || opts.Shards < 0 {
		if shardIndex, err = ShardIndexDDL(table, opts.Shards); err != nil {
			return "", err
		}
		shardIndex = ";\n" + shardIndex
	}
	// The dead-letter table copies the outbox's columns (LIKE), bytea or text alike.
	return fmt.Sprintf(outboxDDLTemplate, quoted, cols[0], cols[1], cols[2]) + ";\n" +
		fmt.Sprintf(notifyDDLTemplate, function, quoted, NotifyChannel(table)) + ";\n" +
		fmt.Sprintf(deadLetterDDLTemplate, dead, quoted) + shardIndex, nil
}

// ShardIndexDDL returns the statement that creates, if it does not exist, the index that each
// shard's mark walks when the outbox has the given number of shards: an index on
// ShardSQL("kafka_key", shards) and id, in which each shard's rows lie together in id order. A
// shard's harvester thus reads its own rows from their head and none of the other shards', when
// its mark uses ShardMarkClauses. The table and its writers need no change: Postgres computes a
// row's shard as it inserts it. Changing the number of shards needs only the new index (drop the
// old one once no harvester uses it): each number of shards has its own index, named
// <table>_shards<N>. On a large live outbox, run the statement with CONCURRENTLY after CREATE
// INDEX, on its own, so that writers are not blocked while it builds. SHARD-STORAGE.md has the
// measurements that chose this design over a shard column, partial indexes and partitions.
func ShardIndexDDL(table string, shards int) (string, error) {
	if shards < 2 || shards > MaxShards {
		return "", fmt.Errorf("shard index for %d shards: an outbox has 2 to %d shards (one needs no index)", shards, MaxShards)
	}
	quoted, err := QuoteTable(table)
	if err != nil {
		return "", err
	}
	_, name, qualified := strings.Cut(table, ".")
	if !qualified {
		name = table
	}
	// An index lives in its table's schema, so its name is not qualified. It is cut, as Postgres
	// would cut it, to 63 bytes, keeping the suffix that tells the indexes apart.
	suffix := "_shards" + strconv.Itoa(shards)
	index := quoteName(name[:min(len(name), 63-len(suffix))] + suffix)
	return fmt.Sprintf("CREATE INDEX IF NOT EXISTS %s ON %s (%s, id)", index, quoted, ShardSQL("kafka_key", shards)), nil
}

// ShardMarkClauses returns what one shard's mark puts in the subquery that picks the rows to
// mark, so that Postgres walks the index of ShardIndexDDL: a condition to AND with the
// subquery's WHERE clause and the ORDER BY list that replaces "id":
//
//	WHERE (leader_id IS NULL OR leader_id <> $1) AND <where> ORDER BY <orderBy> LIMIT $2
//
// The order is the same as by id, since every row has the one shard. The shard is a range of one
// value, not "= shard", on purpose: Postgres drops from the order it needs an expression that the
// WHERE clause holds constant, and then the primary key gives that order too, and Postgres
// prefers it (it follows the table's order), walking past every other shard's rows from the head
// of the table. The shard number is written into the text, not passed as a parameter, so that
// Postgres plans each shard's mark knowing its shard, in a generic plan as in a custom one. With
// one shard (or none) where is empty and orderBy is "id".
func ShardMarkClauses(shards, shard int) (where, orderBy string) {
	if shards <= 1 {
		return "", "id"
	}
	expr := ShardSQL("kafka_key", shards)
	return fmt.Sprintf("%s BETWEEN %d AND %d", expr, shard, shard), expr + ", id"
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
