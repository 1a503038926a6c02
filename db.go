package goharvest

import (
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
