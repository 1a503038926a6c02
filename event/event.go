package event

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/metric"
)

// Event is something the harvester reports to its event handler.
type Event interface {
	fmt.Stringer
	event()
}

// LeaderAcquired: this harvester became the leader and starts publishing under LeaderID.
type LeaderAcquired struct {
	Shard    int // the shard led; always 0 unless Config.Shards > 1
	LeaderID uuid.UUID
}

// LeaderRefreshed: the leader moved to a new leader ID, so that records whose delivery failed
// (or whose fate is unknown after a database error) are marked and published again.
type LeaderRefreshed struct {
	Shard    int // the shard led; always 0 unless Config.Shards > 1
	LeaderID uuid.UUID
}

// LeaderRevoked: Kafka gave leadership to another harvester (or this one is stopping). In-flight
// records were awaited, within MaxPollInterval, before the handover.
type LeaderRevoked struct{ Shard int }

// LeaderFenced: the leader lost contact with Kafka and stopped publishing, assuming another
// harvester may be elected.
type LeaderFenced struct{ Shard int }

// MeterRead carries a throughput reading: records published and purged.
type MeterRead struct{ Stats metric.MeterStats }

// RecordFailed: an outbox record could not be published. Its key is held back (later records
// with that key wait) while the harvester retries it with backoff; other keys carry on.
// Malformed rows (see RecordError) are read afresh every Limits.HeldCheckInterval, and sent once
// fixed.
type RecordFailed struct {
	ID       int64
	Topic    string
	Key      string
	Attempts int
	Err      error
}

// HeldRecordDeleted: a held record's row was deleted in the outbox (or given another key, to be
// published with that key's records); the record was dropped and its key released.
type HeldRecordDeleted struct {
	ID    int64
	Topic string
	Key   string
}

// RecordDeadLettered: a held record failed more often (Limits.DeadLetterAttempts) or for longer
// (Limits.DeadLetterAfter) than allowed; its row was moved into the dead-letter table and its
// key released, so the key's later records are published without it.
type RecordDeadLettered struct {
	ID       int64
	Topic    string
	Key      string
	Attempts int
	Err      error
}

func (HeldRecordDeleted) event()  {}
func (RecordDeadLettered) event() {}

func (e HeldRecordDeleted) String() string {
	return fmt.Sprintf("held record %d (topic %s, key %q) deleted in the outbox; dropped", e.ID, e.Topic, e.Key)
}

func (e RecordDeadLettered) String() string {
	return fmt.Sprintf("record %d (topic %s, key %q) moved to the dead-letter table after %d attempts: %v",
		e.ID, e.Topic, e.Key, e.Attempts, e.Err)
}

// SchemaRejected: the outbox table lacks a column or has one of a type the harvester cannot
// read (see SchemaError). Nothing is published until the table is altered.
type SchemaRejected struct{ Err error }

func (SchemaRejected) event()           {}
func (e SchemaRejected) String() string { return "schema rejected: " + e.Err.Error() }

func (LeaderAcquired) event()  {}
func (LeaderRefreshed) event() {}
func (LeaderRevoked) event()   {}
func (LeaderFenced) event()    {}
func (MeterRead) event()       {}
func (RecordFailed) event()    {}

func (e LeaderAcquired) String() string  { return "leader acquired: " + e.LeaderID.String() }
func (e LeaderRefreshed) String() string { return "leader refreshed: " + e.LeaderID.String() }
func (LeaderRevoked) String() string     { return "leader revoked" }
func (LeaderFenced) String() string      { return "leader fenced" }
func (e MeterRead) String() string       { return "meter read: " + e.Stats.String() }
func (e RecordFailed) String() string {
	return fmt.Sprintf("record %d (topic %s, key %q) failed, attempt %d: %v", e.ID, e.Topic, e.Key, e.Attempts, e.Err)
}

// HeldRecord describes a record that holds back its key (see goharvest.Harvest.HeldRecords).
type HeldRecord struct {
	ID       int64     `json:"id"`
	Topic    string    `json:"topic"`
	Key      string    `json:"key"`
	Attempts int       `json:"attempts"`
	Error    string    `json:"error"`
	Since    time.Time `json:"since"`
}
