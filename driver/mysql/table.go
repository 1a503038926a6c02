package mysql

import (
	"context"
	"fmt"
	"strings"

	"github.com/goharvest/goharvest/outbox"
)

// payloadColumns are the outbox's columns besides its id, shared by the outbox table and its
// dead-letter table, which keeps every column of a row it takes.
//
//   - create_time is a TIMESTAMP, an instant, as timestamptz is in Postgres: a writer's NOW(6)
//     and the harvester's read agree whatever their sessions' time zones. Its explicit DEFAULT
//     keeps a server with explicit_defaults_for_timestamp off from giving the first TIMESTAMP
//     column ON UPDATE CURRENT_TIMESTAMP, which would rewrite it at every mark.
//   - kafka_key and kafka_value are binary strings: published byte for byte, and a key compares
//     equal only to the same bytes (a text collation would make "A" and "a", or "a" and "a ",
//     one key).
//   - The headers are JSON arrays of strings, MySQL having no array type; the two must have the
//     same length.
//   - leader_id is the marking harvester's UUID, as text.
//
// There is no index on leader_id, for the reason outbox.TableDDL gives: every mark rewrites it.
const payloadColumns = `  create_time         TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  kafka_topic         VARCHAR(249) NOT NULL,
  kafka_key           VARBINARY(255) NOT NULL,  -- pick your own maximum key size
  kafka_value         MEDIUMBLOB,
  kafka_header_keys   JSON NOT NULL,
  kafka_header_values JSON NOT NULL,
  leader_id           CHAR(36) CHARACTER SET ascii COLLATE ascii_bin`

// TableDDL returns the statements that create the outbox table (optionally qualified by its
// database: "shop.outbox") and its dead-letter table (see outbox.DeadLetterTable) where they are
// missing: one statement each, as a server runs one statement at a time unless a client asks
// for more.
func TableDDL(table string) ([]string, error) {
	quoted, dead, err := quoteTables(table)
	if err != nil {
		return nil, err
	}
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + quoted + ` (
  id                  BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
` + payloadColumns + `
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`,
		// The outbox id is kept, as the key; then what goharvest knows of the failure.
		`CREATE TABLE IF NOT EXISTS ` + dead + ` (
  id                  BIGINT NOT NULL PRIMARY KEY,
` + payloadColumns + `,
  error               TEXT NOT NULL,
  attempts            INT NOT NULL,
  first_failure_time  TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  last_failure_time   TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
  dead_letter_time    TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`,
	}, nil
}

// CreateOutboxTable connects to dataSource and runs TableDDL's statements for table. A database
// in a qualified name must exist already.
func CreateOutboxTable(ctx context.Context, dataSource, table string) error {
	ddl, err := TableDDL(table)
	if err != nil {
		return err
	}
	db, err := openDB(dataSource)
	if err != nil {
		return fmt.Errorf("create outbox table %s: %w", table, err)
	}
	defer db.Close()
	for _, statement := range ddl {
		if _, err := db.ExecContext(ctx, statement); err != nil {
			return fmt.Errorf("create outbox table %s: %w", table, err)
		}
	}
	return nil
}

// quoteTables checks and quotes the outbox table's name and its dead-letter table's.
func quoteTables(outboxTable string) (table, dead string, err error) {
	if table, err = outbox.QuoteTableMySQL(outboxTable); err != nil {
		return "", "", err
	}
	// The dead-letter name is the outbox's, cut and suffixed: checked, it cannot fail.
	dead, err = outbox.QuoteTableMySQL(outbox.DeadLetterTable(outboxTable))
	return table, dead, err
}

// splitTable returns a table name's database ("" for the connection's) and table.
func splitTable(name string) (database, table string) {
	if db, t, ok := strings.Cut(name, "."); ok {
		return db, t
	}
	return "", name
}
