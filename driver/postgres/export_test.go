package postgres

import (
	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/outbox"
)

// ShardMarkStatements returns what a shard's view of the store (Store.Shard) marks with, for
// tests of its plan: the subquery that picks the rows, and the whole statement.
func ShardMarkStatements(table string, shards, shard int) (pick, mark string) {
	where, orderBy := outbox.ShardMarkClauses(shards, shard)
	return pickStatement(table, " AND "+where, orderBy), markStatement(table, " AND "+where, orderBy)
}

// ShardReadStatement returns what a shard's view of the store reads with (the read strategy).
func ShardReadStatement(table string, shards, shard int) string {
	where, orderBy := outbox.ShardMarkClauses(shards, shard)
	return readStatement(table, " AND "+where, orderBy)
}

// ShardClaimBatch returns what a shard's view sends to claim with sql.
func ShardClaimBatch(sql string, args ...any) *pgx.Batch { return shardClaimBatch(sql, args...) }
