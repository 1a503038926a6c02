package epoch

import (
	"slices"
	"time"

	"github.com/goharvest/goharvest/driver"
	"go.opentelemetry.io/otel/trace"
)

// A record's life in the pipeline, and who touches it when:
//
//  1. The marker claims the row (claim.go) and makes its flight, then hands it to the send
//     worker that owns its key (mark.go). From then on the flight belongs to that worker.
//  2. The worker queues it behind the key's earlier records (keyQueue) and sends it when the key
//     may have a run with Kafka: none is out, or the key's run in the open transaction may grow
//     (worker.go). A record that cannot be sent holds back its key (held.go).
//  3. Sent, the record is out: the transaction loop commits or aborts its transaction (txn.go),
//     the delivery reader notes the producer's report on it, and the committers purge its row
//     once it is committed (purge.go). Meanwhile they read the flight and write only the fields
//     the table gives them; the worker writes none of it.
//  4. The committers tell the worker it is purged (or the transaction loop, that its run was
//     aborted); the worker takes it back and drops it from the queue, or sends it again.
//
// Who writes each field of a flight (reading follows the same hand-over):
//
//	field                           written by
//	rec, markSeq, claimed, worker   the marker, when it makes the flight; rec again by the worker
//	                                when the held loop's read of the row finds it changed (judge)
//	attempts, held, done            the worker
//	free, due, fresh, doomed        the worker (held keys, held.go)
//	version, firstFailure, lastErr  the worker (held keys, held.go)
//	span                            started by the worker as it produces the record, ended by the
//	                                transaction loop while the record is out (trace.go)
//	noted                           the transaction loop, when the commit's note lists the record
//	purgedAt                        the committers, when its purge has committed
//	failure                         the delivery reader, under activity.mu; cleared by the worker
//	                                (activity.producing) as it sends the record again

// flight is one record on its way through the pipeline (see the table above).
type flight struct {
	rec      driver.MarkedRecord
	worker   *sendWorker
	attempts int
	span     trace.Span // the publish span, when tracing is on
	// held stops the key's queue at this record (waiting out a backoff, or malformed); done
	// means purged, to be dropped from the queue.
	held, done bool
	// noted means a committed note lists this record.
	noted bool
	// claimed is when the marker claimed it (see cadenceDue).
	claimed time.Time
	// markSeq numbers the claim that returned this record; purgedAt is the number of the latest
	// claim begun when its purge had committed (see sendWorker.wasPurged).
	markSeq, purgedAt uint64
	// failure is what the delivery report said about the latest send (nil: success or not yet
	// reported).
	failure error
	// Held keys' state (held.go). free: not counted in the in-flight budget (a held key's record).
	// due: backoff over, to be sent once read afresh. fresh: read afresh since the last attempt.
	// doomed: to be moved to the dead-letter table, never sent. version: the row version read
	// afresh ("" for content from the claim). firstFailure, lastErr: its failures.
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

// keyQueue is one key's records, claimed and not yet finished, in the order to publish them. It
// belongs to the worker that owns the key.
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
