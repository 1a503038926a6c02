package goharvest

import (
	"github.com/goharvest/goharvest/internal/epoch"
	"github.com/goharvest/goharvest/outbox"
)

// ShardMarkStatements returns what a shard's view of the binding (PostgresBinding.Shard) marks
// with, for tests of its plan: the subquery that picks the rows, and the whole statement.
func ShardMarkStatements(table string, shards, shard int) (pick, mark string) {
	where, orderBy := outbox.ShardMarkClauses(shards, shard)
	return pickStatement(table, " AND "+where, orderBy), markStatement(table, " AND "+where, orderBy)
}

// ShardReadStatement returns what a shard's view of the binding reads with (the read strategy).
func ShardReadStatement(table string, shards, shard int) string {
	where, orderBy := outbox.ShardMarkClauses(shards, shard)
	return readStatement(table, " AND "+where, orderBy)
}

// EncodeNote and MaxNotedRecords let tests write a note as the harvester does (see note.go).
var EncodeNote = epoch.EncodeNote

type Noted = epoch.Noted

const MaxNotedRecords = epoch.MaxNotedRecords
