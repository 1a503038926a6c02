//go:build cgo

package franz_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
)

// The rules of the franz producer beyond the shared contract: what it refuses, and how it ends a
// transaction that ran out of time or lost a message.

// A commit whose call runs out of time goes on, and the next call returns its outcome; meanwhile
// neither Produce nor an abort can cut in.
func TestCommitOutOfTimeGoesOn(t *testing.T) {
	c := kafkacluster.Shared(t)
	topic := c.Topic(t, fmt.Sprintf("franz-resume-%d", time.Now().UnixNano()), 1)
	p := open(t, newProducer(t, c.Addr(), fmt.Sprintf("franz-resume-%d", time.Now().UnixNano())))
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := p.send(driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	p.await(t, 1)

	expired, cancel := context.WithCancel(t.Context())
	cancel()
	var txnErr *driver.TxnError
	if err := p.CommitTransaction(expired); !errors.As(err, &txnErr) || !txnErr.Retriable {
		t.Fatalf("a commit given no time returned %v, want a retriable TxnError", err)
	}
	if err := p.Produce(driver.Message{Topic: topic, Value: []byte("late")}); !errors.As(err, &txnErr) || !txnErr.Retriable {
		t.Errorf("Produce while the commit is under way returned %v, want a retriable TxnError", err)
	}
	if err := p.AbortTransaction(timeout(t, 30*time.Second)); !errors.As(err, &txnErr) || !txnErr.Retriable {
		t.Errorf("an abort while the commit is under way returned %v, want a retriable TxnError", err)
	}
	if err := p.CommitTransaction(timeout(t, 30*time.Second)); err != nil {
		t.Fatalf("the commit resumed with time returned %v", err)
	}
	if got := kafkatest.ReadCommitted(t, c.Addr(), topic, 1, 10*time.Second); len(got) != 1 || string(got[0].Value) != "v" {
		t.Fatalf("a consumer received %v, want the committed message", got)
	}
}

// A transaction in which a message failed takes no more messages and does not commit (kgo alone
// would commit the others): the commit is abortable, and after the abort the next transaction
// commits.
func TestFailedMessageForbidsCommit(t *testing.T) {
	c := kafkacluster.Shared(t)
	topic := c.Topic(t, fmt.Sprintf("franz-failed-%d", time.Now().UnixNano()), 1)
	p := open(t, newProducer(t, c.Addr(), fmt.Sprintf("franz-failed-%d", time.Now().UnixNano())))
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for _, m := range []driver.Message{
		{Topic: topic, Key: []byte("k"), Value: []byte("fine"), Opaque: "fine"},
		// Larger than a produce request may carry (kgo's ProducerBatchMaxBytes, 1000012 by default):
		// kgo fails it without sending it.
		{Topic: topic, Key: []byte("k"), Value: make([]byte, 2<<20), Opaque: "huge"},
	} {
		if err := p.send(m); err != nil {
			t.Fatal(err)
		}
	}
	got := map[any]error{}
	for range 2 {
		select {
		case d := <-p.reports:
			got[d.Opaque] = d.Err
		case <-time.After(30 * time.Second):
			t.Fatal("deliveries not reported within 30s")
		}
	}
	var rejected *driver.RejectedError
	if got["fine"] != nil || !errors.As(got["huge"], &rejected) {
		t.Fatalf("deliveries %v, want the small message delivered and the huge one rejected", got)
	}
	var txnErr *driver.TxnError
	if err := p.Produce(driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("doomed")}); !errors.As(err, &txnErr) || !txnErr.Retriable {
		t.Errorf("Produce into a transaction that must abort returned %v, want a retriable TxnError", err)
	}
	if err := p.CommitTransaction(timeout(t, 30*time.Second)); !errors.As(err, &txnErr) || !txnErr.Abortable || txnErr.Fatal {
		t.Fatalf("the commit of a transaction with a failed message returned %v, want an abortable TxnError", err)
	}
	if err := p.AbortTransaction(timeout(t, 30*time.Second)); err != nil {
		t.Fatalf("AbortTransaction: %v", err)
	}
	p.publish(t, driver.NotePlace{}, "", driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("next")})
	if got := kafkatest.ReadCommitted(t, c.Addr(), topic, 2, 5*time.Second); len(got) != 1 || string(got[0].Value) != "next" {
		t.Fatalf("a consumer received %v, want only the next transaction's message", got)
	}
}

// Produce refuses a message once MaxQueued are waiting for delivery, without blocking; a commit
// flushes what lingers and makes room again; an abort fails what lingers.
func TestFullQueueRefusesAtOnce(t *testing.T) {
	c := kafkacluster.Shared(t)
	topic := c.Topic(t, fmt.Sprintf("franz-full-%d", time.Now().UnixNano()), 1)
	// A linger of a minute (kgo's longest) keeps the first message queued until the commit
	// flushes it.
	client := franz.New(franz.Config{SeedBrokers: []string{c.Addr()}, MaxQueued: 1, Linger: time.Minute})
	kp, err := client.NewProducer(driver.ProducerConfig{TransactionalID: fmt.Sprintf("franz-full-%d", time.Now().UnixNano()),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	p := open(t, kp)
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	msg := driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("v")}
	if err := p.send(msg); err != nil {
		t.Fatal(err)
	}
	if err := p.Produce(msg); !errors.Is(err, driver.ErrQueueFull) {
		t.Fatalf("Produce with the queue full returned %v, want ErrQueueFull", err)
	}
	if err := p.CommitTransaction(timeout(t, 30*time.Second)); err != nil {
		t.Fatalf("CommitTransaction: %v", err)
	}
	p.await(t, 1)
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := p.Produce(msg); err != nil {
		t.Fatalf("Produce once the commit made room returned %v", err)
	}
	// The abort fails the lingering message, and reports it.
	if err := p.AbortTransaction(timeout(t, 30*time.Second)); err != nil {
		t.Fatalf("AbortTransaction: %v", err)
	}
	if d := <-p.reports; d.Err == nil {
		t.Error("a message aborted before it was sent was reported delivered")
	}
}

// A note written in a transaction whose every message failed goes with its abort. kgo sends the
// abort's EndTxn only for a transaction that produced, and knows nothing of the note, which
// WriteNote sends itself: were the note left in the broker's transaction, the next transaction of
// the same producer epoch would commit it.
func TestNoteOfAFailedTransactionNeverCommits(t *testing.T) {
	c := kafkacluster.Shared(t)
	run := time.Now().UnixNano()
	noteOfAFailedTransactionNeverCommits(t, c, fmt.Sprintf("franz-failed-note-%d", run),
		func(t *testing.T, txnID string) driver.KafkaProducer { return newProducer(t, c.Addr(), txnID) })
}

// noteOfAFailedTransactionNeverCommits is TestNoteOfAFailedTransactionNeverCommits on cluster c,
// with producers from newP, and name as topic, notes group and transactional ID.
func noteOfAFailedTransactionNeverCommits(t *testing.T, c *kafkacluster.Cluster, name string,
	newP func(t *testing.T, txnID string) driver.KafkaProducer) {
	t.Helper()
	topic := c.Topic(t, name, 1)
	place := driver.NotePlace{Group: name, Topic: topic}
	p := open(t, newP(t, name))
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := p.send(driver.Message{Topic: topic, Key: []byte("k"), Value: make([]byte, 2<<20)}); err != nil {
		t.Fatal(err)
	}
	if d := <-p.reports; d.Err == nil {
		t.Fatal("a message too large to send was reported delivered")
	}
	if err := p.WriteNote(timeout(t, 30*time.Second), place, "goharvest/2:aborted"); err != nil {
		t.Fatalf("WriteNote: %v", err)
	}
	var txnErr *driver.TxnError
	if err := p.CommitTransaction(timeout(t, 30*time.Second)); !errors.As(err, &txnErr) || !txnErr.Abortable {
		t.Fatalf("the commit of a transaction whose message failed returned %v, want an abortable TxnError", err)
	}
	if err := p.AbortTransaction(timeout(t, 30*time.Second)); err != nil {
		t.Fatalf("AbortTransaction: %v", err)
	}
	p.publish(t, place, "", driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("next")})
	if got := open(t, newP(t, name)).readNote(t, place); got != "" {
		t.Fatalf("ReadNote = %q after the note's transaction aborted, want \"\"", got)
	}
}

// A message for a topic that does not exist waits (ErrTopicPending) while the producer asks for
// the topic's metadata, which lets the broker create it; a topic the broker will not create is
// then refused by goharvest, before any message is queued, as the librdkafka driver refuses it.
func TestMissingTopicIsCreatedOrRefused(t *testing.T) {
	c := kafkacluster.Shared(t)
	run := time.Now().UnixNano()
	p := open(t, newProducer(t, c.Addr(), fmt.Sprintf("franz-missing-%d", run)))

	created := fmt.Sprintf("franz-created-%d", run) // auto.create.topics.enable is Kafka's default
	p.publish(t, driver.NotePlace{}, "", driver.Message{Topic: created, Key: []byte("k"), Value: []byte("v")})
	if got := kafkatest.ReadCommitted(t, c.Addr(), created, 1, 10*time.Second); len(got) != 1 {
		t.Fatalf("a consumer of the created topic received %d messages, want 1", len(got))
	}

	// Kafka creates no topic whose name differs from an existing one's only in '.' against '_'.
	c.Topic(t, fmt.Sprintf("franz_collides_%d", run), 1)
	colliding := fmt.Sprintf("franz.collides.%d", run)
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	err := kafkatest.Produce(p, driver.Message{Topic: colliding, Key: []byte("k"), Value: []byte("v")}, 30*time.Second)
	var rejected *driver.RejectedError
	if !errors.As(err, &rejected) || !rejected.ByGoharvest {
		t.Fatalf("Produce to a topic Kafka will not create returned %v, want ErrTopicPending and then a RejectedError by goharvest", err)
	}
	t.Logf("refused: %v", err)
	if err := p.AbortTransaction(timeout(t, 30*time.Second)); err != nil {
		t.Fatalf("AbortTransaction: %v", err)
	}
}

// A producer fenced before it sends anything learns it from its message's delivery, which fails;
// its next Produce and its commit then fail fatally.
func TestFencedBeforeProducingFailsTheCommit(t *testing.T) {
	c := kafkacluster.Shared(t)
	run := time.Now().UnixNano()
	topic := c.Topic(t, fmt.Sprintf("franz-fenced-early-%d", run), 1)
	txnID := fmt.Sprintf("franz-fenced-early-%d", run)
	old := open(t, newProducer(t, c.Addr(), txnID))
	open(t, newProducer(t, c.Addr(), txnID))
	if err := old.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := old.send(driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("deposed")}); err != nil {
		t.Fatal(err)
	}
	if d := <-old.reports; d.Err == nil {
		t.Fatal("the fenced producer's message was reported delivered")
	} else {
		t.Logf("delivery: %v", d.Err)
	}
	var txnErr *driver.TxnError
	if err := old.Produce(driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("deposed")}); !errors.As(err, &txnErr) || !txnErr.Fatal {
		t.Errorf("Produce after the fenced delivery returned %v, want a fatal TxnError", err)
	}
	err := old.CommitTransaction(timeout(t, 30*time.Second))
	if !errors.As(err, &txnErr) || !txnErr.Fatal {
		t.Fatalf("the fenced producer's commit returned %v, want a fatal TxnError", err)
	}
	if err := old.BeginTransaction(); !errors.As(err, &txnErr) || !txnErr.Fatal {
		t.Errorf("BeginTransaction after the fatal commit returned %v, want a fatal TxnError", err)
	}
}
