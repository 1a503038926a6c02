package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/outbox"
)

// DefaultDataSource is a local Postgres reached as user postgres: the reaper's dataSource when
// its file sets none.
const DefaultDataSource = "host=localhost port=5432 user=postgres dbname=postgres sslmode=disable"

// CreateOutboxTable connects to dataSource and runs outbox.TableDDLWith's statements for table:
// the outbox table, its notification trigger and its dead-letter table, where they are missing
// (and, with opts.Shards > 1, the shards' index). A schema in a qualified name must exist
// already.
func CreateOutboxTable(ctx context.Context, dataSource, table string, opts outbox.TableOptions) error {
	ddl, err := outbox.TableDDLWith(table, opts)
	if err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, dataSource)
	if err != nil {
		return fmt.Errorf("create outbox table: connect: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("create outbox table %s: %w", table, err)
	}
	return nil
}
