package drivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/outbox"
)

// Kafka is a broker under test.
type Kafka struct {
	// NewProducer returns a producer with the transactional ID given, before InitTransactions.
	// The suite closes it.
	NewProducer func(t *testing.T, txnID string) driver.KafkaProducer
	// Topic returns a topic that exists and that nothing else uses.
	Topic func(t *testing.T) string
	// NoteGroup returns a consumer group for notes that nothing else uses.
	NoteGroup func(t *testing.T) string
	// Committed returns the messages of topic that a read_committed consumer receives, in order,
	// once it has want of them or has waited long enough to say there are no more.
	Committed func(t *testing.T, topic string, want int) []Message
}

// Message is a message as a consumer receives it.
type Message struct {
	Key, Value []byte
	Headers    outbox.Headers
}

// RunProducer runs the producer contract, each rule in a subtest.
func RunProducer(t *testing.T, k Kafka) {
	for _, c := range []struct {
		name string
		test func(t *testing.T, k Kafka)
	}{
		{"CommitPublishesInOrder", commitPublishesInOrder},
		{"AbortPublishesNothing", abortPublishesNothing},
		{"NoteFollowsTheCommit", noteFollowsTheCommit},
		{"NewProducerFencesTheOld", newProducerFencesTheOld},
		{"InvalidTopicIsRefused", invalidTopicIsRefused},
	} {
		t.Run(c.name, func(t *testing.T) { c.test(t, k) })
	}
}

var txnIDs struct {
	sync.Mutex
	n int
}

func newTxnID(t *testing.T) string {
	txnIDs.Lock()
	defer txnIDs.Unlock()
	txnIDs.n++
	return fmt.Sprintf("drivertest.%d.%d", time.Now().UnixNano(), txnIDs.n)
}

// producer is a producer under test with its delivery reports gathered.
type producer struct {
	driver.KafkaProducer
	mu      sync.Mutex
	reports map[any]int // opaque -> reports received
	errs    map[any]error
	done    chan struct{} // closed once Deliveries is
}

func start(t *testing.T, k Kafka, txnID string) *producer {
	t.Helper()
	p := &producer{KafkaProducer: k.NewProducer(t, txnID), reports: map[any]int{}, errs: map[any]error{}, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for d := range p.Deliveries() {
			p.mu.Lock()
			p.reports[d.Opaque]++
			p.errs[d.Opaque] = d.Err
			p.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		p.Close()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Error("Close did not close Deliveries")
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.InitTransactions(ctx); err != nil {
		t.Fatalf("InitTransactions: %v", err)
	}
	return p
}

// send produces msg, trying again while the producer says to (a topic being looked up, a full
// queue), as the engine does.
func (p *producer) send(t *testing.T, msg driver.Message) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := p.Produce(msg)
		if err == nil {
			return
		}
		if (errors.Is(err, driver.ErrTopicPending) || errors.Is(err, driver.ErrQueueFull)) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		t.Fatalf("Produce: %v", err)
	}
}

// awaitReports waits until each opaque has been reported once, and fails if any was reported
// twice or with an error when ok is set.
func (p *producer) awaitReports(t *testing.T, ok bool, opaques ...any) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		p.mu.Lock()
		all := true
		for _, o := range opaques {
			all = all && p.reports[o] > 0
		}
		p.mu.Unlock()
		if all {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not every message was reported within 30s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, o := range opaques {
		if n := p.reports[o]; n != 1 {
			t.Errorf("message %v reported %d times", o, n)
		}
		if err := p.errs[o]; ok && err != nil {
			t.Errorf("message %v reported failed: %v", o, err)
		}
	}
}

func call(t *testing.T, what string, f func(context.Context) error) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return f(ctx)
}

func value(s string) []byte { return []byte(s) }

// A transaction's messages are reported delivered, each once, with their opaque values, and a
// read_committed consumer receives them once the transaction commits, in order, with their keys,
// values (a tombstone as no value) and headers.
func commitPublishesInOrder(t *testing.T, k Kafka) {
	topic := k.Topic(t)
	p := start(t, k, newTxnID(t))
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	sent := []driver.Message{
		{Topic: topic, Key: []byte("k"), Value: value("1"), Headers: outbox.Headers{{Key: "h", Value: "a"}, {Key: "h", Value: "b"}}, Opaque: 1},
		{Topic: topic, Key: []byte("k"), Value: value("2"), Opaque: 2},
		{Topic: topic, Key: []byte("k"), Value: nil, Opaque: 3},
		{Topic: topic, Key: []byte("k"), Value: value("4"), Opaque: 4},
	}
	for _, m := range sent {
		p.send(t, m)
	}
	p.awaitReports(t, true, 1, 2, 3, 4)
	if err := call(t, "commit", p.CommitTransaction); err != nil {
		t.Fatalf("CommitTransaction: %v", err)
	}
	got := k.Committed(t, topic, len(sent))
	if len(got) != len(sent) {
		t.Fatalf("a consumer received %d messages, want %d", len(got), len(sent))
	}
	for i, m := range got {
		w := sent[i]
		if string(m.Key) != string(w.Key) || (m.Value == nil) != (w.Value == nil) || string(m.Value) != string(w.Value) ||
			!slices.Equal(m.Headers, w.Headers) && len(w.Headers)+len(m.Headers) > 0 {
			t.Errorf("message %d received as key %q value %q headers %v; sent key %q value %q headers %v",
				i, m.Key, m.Value, m.Headers, w.Key, w.Value, w.Headers)
		}
	}
}

// An aborted transaction's messages are reported, each once, and never reach a read_committed
// consumer; the next transaction's do.
func abortPublishesNothing(t *testing.T, k Kafka) {
	topic := k.Topic(t)
	p := start(t, k, newTxnID(t))
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		p.send(t, driver.Message{Topic: topic, Key: []byte("k"), Value: value("aborted"), Opaque: i})
	}
	p.awaitReports(t, false, 0, 1, 2)
	if err := call(t, "abort", p.AbortTransaction); err != nil {
		t.Fatalf("AbortTransaction: %v", err)
	}
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	p.send(t, driver.Message{Topic: topic, Key: []byte("k"), Value: value("committed"), Opaque: "after"})
	p.awaitReports(t, true, "after")
	if err := call(t, "commit", p.CommitTransaction); err != nil {
		t.Fatalf("CommitTransaction: %v", err)
	}
	got := k.Committed(t, topic, 2) // waits for a second message, which must not come
	if len(got) != 1 || string(got[0].Value) != "committed" {
		t.Fatalf("a consumer received %d messages (%v), want only the committed one", len(got), got)
	}
}

// A note written in a transaction that commits is what the next producer of the transactional
// ID reads after its InitTransactions; a note written in a transaction that aborts is never read;
// a place where no note was written reads "".
func noteFollowsTheCommit(t *testing.T, k Kafka) {
	topic, txnID := k.Topic(t), newTxnID(t)
	place := driver.NotePlace{Group: k.NoteGroup(t), Topic: topic, Partition: 0}
	p := start(t, k, txnID)
	for i, c := range []struct {
		note   string
		commit bool
	}{{"goharvest/1:first", true}, {"goharvest/1:second", false}} {
		if err := p.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		p.send(t, driver.Message{Topic: topic, Key: []byte("k"), Value: value(c.note), Opaque: i})
		p.awaitReports(t, false, i)
		if err := call(t, "write note", func(ctx context.Context) error { return p.WriteNote(ctx, place, c.note) }); err != nil {
			t.Fatalf("WriteNote: %v", err)
		}
		end := p.AbortTransaction
		if c.commit {
			end = p.CommitTransaction
		}
		if err := call(t, "end", end); err != nil {
			t.Fatalf("end transaction: %v", err)
		}
	}
	next := start(t, k, txnID)
	var note string
	err := call(t, "read note", func(ctx context.Context) (err error) { note, err = next.ReadNote(ctx, place); return err })
	if err != nil || note != "goharvest/1:first" {
		t.Errorf("ReadNote = %q, %v; want the committed note", note, err)
	}
	fresh := driver.NotePlace{Group: k.NoteGroup(t), Topic: topic, Partition: 0}
	err = call(t, "read note", func(ctx context.Context) (err error) { note, err = next.ReadNote(ctx, fresh); return err })
	if err != nil || note != "" {
		t.Errorf("ReadNote of a place with no note = %q, %v; want \"\"", note, err)
	}
}

// A new producer's InitTransactions fences an older one with the same transactional ID: the old
// one's commit fails with a fatal TxnError, and its messages never reach a consumer.
func newProducerFencesTheOld(t *testing.T, k Kafka) {
	topic, txnID := k.Topic(t), newTxnID(t)
	old := start(t, k, txnID)
	if err := old.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	old.send(t, driver.Message{Topic: topic, Key: []byte("k"), Value: value("deposed"), Opaque: 1})
	old.awaitReports(t, false, 1)
	start(t, k, txnID)
	err := call(t, "commit", old.CommitTransaction)
	var txnErr *driver.TxnError
	if !errors.As(err, &txnErr) || !txnErr.Fatal {
		t.Errorf("the fenced producer's commit returned %v, want a fatal TxnError", err)
	}
	if got := k.Committed(t, topic, 1); len(got) != 0 {
		t.Errorf("a consumer received %d messages of the fenced producer", len(got))
	}
}

// A message for a topic name Kafka cannot accept is refused by Produce, as goharvest's own
// check, without being reported.
func invalidTopicIsRefused(t *testing.T, k Kafka) {
	p := start(t, k, newTxnID(t))
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	err := p.Produce(driver.Message{Topic: "no such topic!", Key: []byte("k"), Value: value("v"), Opaque: 1})
	var rejected *driver.RejectedError
	if !errors.As(err, &rejected) || !rejected.ByGoharvest {
		t.Fatalf("Produce to an invalid topic name returned %v, want a RejectedError by goharvest", err)
	}
	if err := call(t, "abort", p.AbortTransaction); err != nil {
		t.Fatalf("AbortTransaction: %v", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if n := p.reports[1]; n != 0 {
		t.Errorf("a refused message was reported %d times", n)
	}
}
