package epoch

import (
	"slices"
	"time"

	"github.com/goharvest/goharvest/internal/seam"
	"go.opentelemetry.io/otel/trace"
)

// flight is one record on its way through the pipeline. It belongs to the send worker that owns
// its key. While the record is out (from produce until the worker hears that its transaction
// aborted, or that it was purged, or went stale) the transaction loop and the committers read
// it, and write only the fields marked as theirs below; the worker then writes none of it.
type flight struct {
	rec      seam.MarkedRecord
	worker   *sendWorker
	attempts int
	span     trace.Span // the publish span, when tracing is on (ended by the transaction loop)
	// held and done belong to the worker: held stops the key's queue at this record (waiting out
	// a backoff, or malformed); done means purged, to be dropped from the queue.
	held, done bool
	// noted means a committed note lists this record (written by the transaction loop before the
	// record reaches the committers).
	noted bool
	// markSeq numbers the mark that returned this record; purgedAt is the number of the latest
	// mark begun when its purge had committed (written by the committers; see sendWorker.purged).
	markSeq, purgedAt uint64
	// failure is what the delivery report said about the latest send (nil: success or not yet
	// reported). Guarded by activity.mu: the delivery reader writes it while others may read.
	failure error
	// The worker owns these too; see held.go. free: not counted in the in-flight budget (a held
	// key's record). due: backoff over, to be sent once read afresh. fresh: read afresh since the
	// last attempt. doomed: to be moved to the dead-letter table, never sent. version: the row
	// version read afresh ("" for content from the mark). firstFailure, lastErr: its failures.
	free, due, fresh, doomed bool
	version                  string
	firstFailure             time.Time
	lastErr                  error
}

// outcome is Kafka's verdict on a flight, for the committers.
type outcome struct {
	f      *flight
	failed bool // reset rather than purge
}

// keyQueue is one key's records, marked and not yet finished, in the order to publish them.
type keyQueue struct {
	flights []*flight
	out     int // how many at the front are with Kafka: a run in transaction gen
	gen     uint64
	held    *flight // the record that holds back the key, if any (held.go)
}

// holds reports whether the queue has the record with this id. Until its purge commits, a
// record can be marked again.
func (q *keyQueue) holds(id int64) bool {
	for _, f := range q.flights {
		if f.rec.ID == id {
			return true
		}
	}
	return false
}

// index returns the position of f in q, or -1.
func (q *keyQueue) index(f *flight) int { return slices.Index(q.flights, f) }

// key returns the queue's key.
func (q *keyQueue) key() string { return q.flights[0].rec.KafkaKey }

// RecordID returns the id of the flight's record. The flight is the opaque value of the record's
// message, so that a test's producer can tell which record a message publishes.
func (f *flight) RecordID() int64 { return f.rec.ID }
