// Package outbox is what the writers and the readers of an outbox table share: the record and its
// headers, the table's DDL and notification channel, and the rule for Kafka topic names. It
// depends on no Kafka client and needs no cgo, so that a service that only writes outbox rows
// (package stasher) carries nothing of the harvester.
package outbox

import (
	"time"

	"github.com/google/uuid"
)

// Header is one header of a Kafka message. Value holds bytes, as any Go string can: UTF-8
// text from a text[] column, anything from a bytea[] one.
type Header struct {
	Key   string
	Value string
}

// Headers are a message's headers, in order. Keys may repeat.
type Headers []Header

// Record is one row of the outbox table: a Kafka message waiting to be published.
type Record struct {
	// ID is assigned by the database (BIGSERIAL). It orders the records of one key.
	ID int64
	// CreateTime is when the record was written.
	CreateTime time.Time
	// KafkaTopic is the topic to publish to. Records of one outbox may name different topics.
	KafkaTopic string
	// KafkaKey is the message key. Records with the same key are published in the order of
	// their IDs, and land on the same partition. It holds the key's bytes: UTF-8 from a text
	// column, anything from a bytea one.
	KafkaKey string
	// KafkaValue is the message value. nil publishes a message with no value (a tombstone, for
	// compacted topics); a pointer to "" publishes an empty value. It holds the value's bytes:
	// UTF-8 from a text column, anything from a bytea one, JSON text from json or jsonb.
	KafkaValue *string
	// KafkaHeaders are the message headers.
	KafkaHeaders Headers
	// LeaderID is the harvester that has marked the record as in flight; nil when none has.
	LeaderID *uuid.UUID
}

// String returns a pointer to s, for Record.KafkaValue.
func String(s string) *string { return &s }
