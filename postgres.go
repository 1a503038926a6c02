package goharvest

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/outbox"
)

// NewPostgresBinding opens the Postgres store of an outbox table (package driver/postgres, on a
// pgx pool): the default store of a harvester, and what a DatabaseBindingProvider that wraps it
// opens.
func NewPostgresBinding(dataSource, outboxTable string, options ...postgres.Option) (*postgres.Store, error) {
	return postgres.New(dataSource, outboxTable, options...)
}

// StandardPostgresBindingProvider opens the Postgres store with the given options.
func StandardPostgresBindingProvider(options ...postgres.Option) DatabaseBindingProvider {
	return func(dataSource, outboxTable string) (driver.DatabaseBinding, error) {
		return postgres.New(dataSource, outboxTable, options...)
	}
}

// TableOptions choose how OutboxTableDDLWith and CreateOutboxTableWith make the outbox table.
type TableOptions = outbox.TableOptions

// OutboxTableDDL returns the statements that create an outbox table with the given (optionally
// schema-qualified) name, if it does not exist, its notification trigger (see NotifyChannel) and
// its dead-letter table (see DeadLetterTable). Run them as one script; they may be run again.
func OutboxTableDDL(table string) (string, error) { return outbox.TableDDL(table) }

// OutboxTableDDLWith is OutboxTableDDL with a choice of column types.
func OutboxTableDDLWith(table string, opts TableOptions) (string, error) {
	return outbox.TableDDLWith(table, opts)
}

// NotifyChannel returns the channel on which a harvester of the outbox table listens (see
// outbox.NotifyChannel).
func NotifyChannel(table string) string { return outbox.NotifyChannel(table) }

// CreateOutboxTable connects to dataSource and creates the outbox table if it does not exist.
// A schema in a qualified name must exist already.
func CreateOutboxTable(ctx context.Context, dataSource, table string) error {
	return CreateOutboxTableWith(ctx, dataSource, table, TableOptions{})
}

// CreateOutboxTableWith is CreateOutboxTable with a choice of column types.
func CreateOutboxTableWith(ctx context.Context, dataSource, table string, opts TableOptions) error {
	ddl, err := OutboxTableDDLWith(table, opts)
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

// DeadLetterSuffix is put after the outbox table's name to make its dead-letter table's name.
const DeadLetterSuffix = outbox.DeadLetterSuffix

// DeadLetterTable returns the name of the dead-letter table of an outbox table (see
// outbox.DeadLetterTable).
func DeadLetterTable(outboxTable string) string { return outbox.DeadLetterTable(outboxTable) }

// ErrNoSuchRecord says that no row has the given id (DeadLetterNow, Requeue).
var ErrNoSuchRecord = postgres.ErrNoSuchRecord

// DeadLetterNow moves the outbox row with the given id into the dead-letter table at once, as an
// operator asks (reaper dead-letter). A leader holding the row finds it gone within
// Limits.HeldCheckInterval, and releases its key; a record the leader is sending at that moment
// may still be published.
func DeadLetterNow(ctx context.Context, dataSource, outboxTable string, id int64, reason string) error {
	return postgres.DeadLetterNow(ctx, dataSource, outboxTable, id, reason)
}

// Requeue moves the row with the given id from the dead-letter table back into the outbox, and
// returns its new id: it goes to the tail, behind every record written meanwhile, so it is
// published after its key's later records (see docs/monitoring.md, "When a row cannot be published").
func Requeue(ctx context.Context, dataSource, outboxTable string, id int64) (int64, error) {
	return postgres.Requeue(ctx, dataSource, outboxTable, id)
}
