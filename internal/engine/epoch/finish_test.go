package epoch

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/outage"
	"github.com/goharvest/goharvest/metric"
)

// idleStore is an empty outbox: what a test of the pipeline's own bookkeeping needs.
type idleStore struct{}

func (idleStore) Mark(context.Context, uuid.UUID, int) ([]driver.MarkedRecord, error) {
	return nil, nil
}
func (idleStore) MarkExcept(context.Context, uuid.UUID, int, []string) ([]driver.MarkedRecord, error) {
	return nil, nil
}
func (idleStore) Purge(_ context.Context, ids []int64) (int, error) { return len(ids), nil }
func (idleStore) Reset(_ context.Context, _ uuid.UUID, ids []int64) (int, error) {
	return len(ids), nil
}
func (idleStore) Reread(context.Context, []int64) ([]driver.RereadRecord, error)    { return nil, nil }
func (idleStore) PurgeUnchanged(context.Context, map[int64]string) ([]int64, error) { return nil, nil }
func (idleStore) DeadLetter(context.Context, int64, string, driver.DeadLetterInfo) (bool, error) {
	return false, nil
}
func (idleStore) Dispose() {}

// idleProducer takes nothing: no record reaches it in these tests.
type idleProducer struct{ deliveries chan driver.Delivery }

func (idleProducer) InitTransactions(context.Context) error                     { return nil }
func (idleProducer) BeginTransaction() error                                    { return nil }
func (idleProducer) CommitTransaction(context.Context) error                    { return nil }
func (idleProducer) AbortTransaction(context.Context) error                     { return nil }
func (idleProducer) WriteNote(context.Context, driver.NotePlace, string) error  { return nil }
func (idleProducer) ReadNote(context.Context, driver.NotePlace) (string, error) { return "", nil }
func (idleProducer) Produce(driver.Message) error                               { return driver.ErrQueueFull }
func (p idleProducer) Deliveries() <-chan driver.Delivery                       { return p.deliveries }
func (idleProducer) Abandon()                                                   {}
func (p idleProducer) Close()                                                   { close(p.deliveries) }

// Once an epoch stops, its workers are gone; the committers' last purges must still return,
// however many records they finish (the worker's channel holds MaxInFlightRecords).
func TestFinishAfterWorkersStopped(t *testing.T) {
	limits := Limits{MaxInFlightRecords: 4, HeartbeatTimeout: time.Second}.WithDefaults()
	p := Start(Deps{
		LeaderID: uuid.New(), Limits: limits, Store: idleStore{}, Producer: idleProducer{make(chan driver.Delivery)},
		Log: slog.New(slog.DiscardHandler), Emit: func(event.Event) {}, Meter: metric.NewMeter("t", time.Hour),
		DBTrouble: &outage.Logger{What: "database"}, Metrics: NewMetrics("t", nil, nil),
		Leading: func() bool { return true }, BusyEpochs: new(atomic.Int32),
	})
	p.cancel()
	p.sending.Wait() // the workers have exited, as in Stop
	var batch []*flight
	for i := range 3 * limits.MaxInFlightRecords {
		batch = append(batch, &flight{rec: driver.MarkedRecord{OutboxRecord: driver.OutboxRecord{ID: int64(i), KafkaKey: "k"}}, worker: p.workers[0]})
	}
	done := make(chan struct{})
	go func() {
		p.finish(batch)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("finish blocked on a worker that has stopped")
	}
	p.Stop(limits.MaxPollInterval)
}
