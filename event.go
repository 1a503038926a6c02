package goharvest

import "github.com/goharvest/goharvest/internal/seam"

// EventHandler receives events in the order they happen, on a goroutine of its own: a slow
// handler delays later events but never the harvester. It need not be safe for concurrent use.
type EventHandler func(Event)

// The events a harvester reports to its EventHandler; see package internal/seam for each one's
// meaning and fields.
type (
	// Event is something the harvester reports to its EventHandler.
	Event = seam.Event
	// LeaderAcquired: this harvester became the leader of a shard and publishes under LeaderID.
	LeaderAcquired = seam.LeaderAcquired
	// LeaderRefreshed: the leader moved to a new leader ID, to mark records again.
	LeaderRefreshed = seam.LeaderRefreshed
	// LeaderRevoked: Kafka gave leadership to another harvester (or this one is stopping).
	LeaderRevoked = seam.LeaderRevoked
	// LeaderFenced: the leader lost contact with Kafka and stopped publishing.
	LeaderFenced = seam.LeaderFenced
	// MeterRead carries a throughput reading.
	MeterRead = seam.MeterRead
	// RecordFailed: an outbox record could not be published; its key is held back.
	RecordFailed = seam.RecordFailed
	// HeldRecordDeleted: a held record's row was deleted (or given another key); it was dropped.
	HeldRecordDeleted = seam.HeldRecordDeleted
	// RecordDeadLettered: a held record was moved into the dead-letter table.
	RecordDeadLettered = seam.RecordDeadLettered
	// SchemaRejected: the outbox table does not fit; nothing is published until it is altered.
	SchemaRejected = seam.SchemaRejected
)
