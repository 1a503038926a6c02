package mysql

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/goharvest/goharvest/driver"
)

// text and binary are the string types a column of text can have; MariaDB's JSON is LONGTEXT
// under another name, and information_schema calls it that.
var (
	text   = []string{"varchar", "char", "tinytext", "text", "mediumtext", "longtext"}
	binary = []string{"varbinary", "binary", "tinyblob", "blob", "mediumblob", "longblob"}
	jsonOK = []string{"json", "longtext", "mediumtext", "text"}
)

// outboxColumns are the columns the harvester reads, with the types (information_schema's
// DATA_TYPE) it can read them as.
var outboxColumns = []driver.Column{
	{Name: "id", Types: []string{"bigint", "int"}},
	// Only TIMESTAMP: UNIX_TIMESTAMP would read a DATETIME in the session's time zone.
	{Name: "create_time", Types: []string{"timestamp"}},
	{Name: "kafka_topic", Types: text},
	{Name: "kafka_key", Types: slices.Concat(binary, text)},
	{Name: "kafka_value", Types: slices.Concat(binary, text, []string{"json"})},
	{Name: "kafka_header_keys", Types: jsonOK},
	{Name: "kafka_header_values", Types: jsonOK},
	{Name: "leader_id", Types: []string{"char", "varchar"}},
}

// CheckSchema implements driver.SchemaChecker: it checks that the outbox table exists and has
// every column the harvester reads, of a type it can read. A mismatch is a *driver.SchemaError
// naming each column; other errors (the database being unreachable) are wrapped as they come.
func (s *Store) CheckSchema(ctx context.Context) error {
	database, table := splitTable(s.name)
	rows, err := s.db.QueryContext(ctx, `SELECT COLUMN_NAME, DATA_TYPE FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = IF(? = '', DATABASE(), ?) AND TABLE_NAME = ?`, database, database, table)
	if err != nil {
		return fmt.Errorf("check outbox table %s: %w", s.name, err)
	}
	defer rows.Close()
	have := map[string]string{}
	for rows.Next() {
		var name, typ string
		if err := rows.Scan(&name, &typ); err != nil {
			return fmt.Errorf("check outbox table %s: %w", s.name, err)
		}
		have[strings.ToLower(name)] = strings.ToLower(typ)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("check outbox table %s: %w", s.name, err)
	}
	if len(have) == 0 {
		return &driver.SchemaError{Table: s.name, Problems: []string{"the table does not exist"}}
	}
	return driver.CheckColumns(s.name, have, outboxColumns)
}
