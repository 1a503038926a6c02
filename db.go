package goharvest

import (
	"github.com/goharvest/goharvest/internal/seam"
	"github.com/goharvest/goharvest/neli"
	"github.com/goharvest/goharvest/outbox"
)

// KafkaHeader is one header of a Kafka message (see outbox.Header).
type KafkaHeader = outbox.Header

// KafkaHeaders are a message's headers, in order (see outbox.Headers).
type KafkaHeaders = outbox.Headers

// OutboxRecord is one row of the outbox table (see outbox.Record). The type lives in package
// outbox, which writers import without the harvester and its Kafka client.
type OutboxRecord = outbox.Record

// String returns a pointer to s, for OutboxRecord.KafkaValue.
func String(s string) *string { return &s }

// The database binding's seams. They are declared, with their contracts, in package
// internal/seam, where the engine reads them; internal/storetest holds every binding (the
// Postgres binding and the tests' in-memory one) to the same contract.
type (
	// MarkedRecord is a record returned by DatabaseBinding.Mark; a malformed row comes back with
	// Err set (see seam.MarkedRecord).
	MarkedRecord = seam.MarkedRecord
	// RecordError says that an outbox row cannot be published as it stands.
	RecordError = seam.RecordError
	// DatabaseBinding is the harvester's access to the outbox table (see seam.DatabaseBinding).
	// The binding a DatabaseBindingProvider returns must also be a HeldRowBinding: Start refuses
	// one that is not, since without it a held record could be sent again with content never
	// read again. A wrapper that embeds a binding must pass those methods on too.
	DatabaseBinding = seam.DatabaseBinding
	// HeldRowBinding is what the harvester needs to hold back a record that cannot be published
	// (see seam.HeldRowBinding).
	HeldRowBinding = seam.HeldRowBinding
	// RereadRecord is a row read afresh, with its version.
	RereadRecord = seam.RereadRecord
	// DeadLetterInfo is what the dead-letter table records about a row besides its columns.
	DeadLetterInfo = seam.DeadLetterInfo
	// HeldRecord describes a record that holds back its key (see Harvest.HeldRecords).
	HeldRecord = seam.HeldRecord
	// SchemaChecker is implemented by bindings that can check the outbox table's columns.
	SchemaChecker = seam.SchemaChecker
	// SchemaError says that the outbox table lacks a column the harvester needs, or has one of a
	// type it cannot read.
	SchemaError = seam.SchemaError
	// Listener is implemented by bindings that can tell the harvester when records are written.
	Listener = seam.Listener
	// Sharder is implemented by bindings that can publish an outbox in shards.
	Sharder = seam.Sharder
	// Pinger is implemented by bindings and electors that can check their connection.
	Pinger = seam.Pinger
	// BacklogSampler is implemented by bindings that can count the outbox's backlog cheaply.
	BacklogSampler = seam.BacklogSampler
)

// ErrNotificationsLost says that a Listener's LISTEN succeeded but notifications do not reach
// it, as behind a connection pooler in transaction mode.
var ErrNotificationsLost = seam.ErrNotificationsLost

// The Postgres binding offers every optional capability; checked here, so that renaming a method
// cannot silently turn a feature off.
var (
	_ seam.Store     = (*PostgresBinding)(nil)
	_ SchemaChecker  = (*PostgresBinding)(nil)
	_ Listener       = (*PostgresBinding)(nil)
	_ Pinger         = (*PostgresBinding)(nil)
	_ BacklogSampler = (*PostgresBinding)(nil)
	_ Sharder        = (*PostgresBinding)(nil)
	_ Elector        = (*neli.Neli)(nil)
	_ Pinger         = (*neli.Neli)(nil)
	_ KafkaProducer  = (*confluentProducer)(nil)
)
