//go:build cgo

package franz_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// On a cluster whose transaction.version is 1 (a Kafka 4.x cluster formatted so, as one upgraded
// from 3.x runs until the feature is raised), the producer runs Kafka's first transaction
// protocol: kgo adds partitions with AddPartitionsToTxn, and WriteNote sends AddOffsetsToTxn and
// TxnOffsetCommit v4. It keeps the producer contract there, its notes read back, through either
// driver, and a fenced producer is refused.
func TestFirstTransactionProtocol(t *testing.T) {
	c := kafkacluster.Start(t, kafkacluster.Feature("transaction.version", 1))
	if level := transactionVersion(t, c.Addr()); level != 1 {
		t.Fatalf("the cluster's transaction.version is %d, want 1", level)
	}
	run := time.Now().UnixNano()
	var names atomic.Int32
	name := func(what string) string { return fmt.Sprintf("franz-tv1-%s-%d-%d", what, run, names.Add(1)) }
	sent := &requestCounter{}
	cfg := franz.Config{SeedBrokers: []string{c.Addr()}, Opts: []kgo.Opt{kgo.WithHooks(sent)}}
	newTV1Producer := func(t *testing.T, txnID string) driver.KafkaProducer {
		t.Helper()
		p, err := franz.New(cfg).NewProducer(driver.ProducerConfig{TransactionalID: txnID, ClientID: "franz-tv1",
			DeliveryTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	t.Run("Contract", func(t *testing.T) {
		drivertest.RunProducer(t, drivertest.Kafka{
			NewProducer: newTV1Producer,
			Topic:       func(t *testing.T) string { return c.Topic(t, name("contract"), 1) },
			NoteGroup:   func(t *testing.T) string { return name("contract-notes") },
			Committed: func(t *testing.T, topic string, want int) []drivertest.Message {
				return kafkatest.ReadCommitted(t, c.Addr(), topic, want, 5*time.Second)
			},
		})
		// The first protocol's requests, and so not KIP-890 part 2's implicit adds.
		for _, key := range []kmsg.Key{kmsg.AddPartitionsToTxn, kmsg.AddOffsetsToTxn, kmsg.TxnOffsetCommit} {
			if sent.count(key) == 0 {
				t.Errorf("no %s request was sent", key.Name())
			}
		}
	})

	t.Run("NotesReadBack", func(t *testing.T) {
		topic := c.Topic(t, name("notes"), 1)
		place := driver.NotePlace{Group: name("notes"), Topic: topic}
		txnID := name("notes")
		msg := driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("v")}
		writer := open(t, newTV1Producer(t, txnID))
		writer.publish(t, place, "goharvest/2:first", msg)
		writer.publish(t, place, "goharvest/2:second", msg) // one AddOffsetsToTxn a transaction
		if got := open(t, newTV1Producer(t, txnID)).readNote(t, place); got != "goharvest/2:second" {
			t.Fatalf("the next franz producer read %q, want the last committed note", got)
		}
		if got := committedMetadata(t, c.Addr(), place); got != "goharvest/2:second" {
			t.Fatalf("the group's committed offset has metadata %q, want the note", got)
		}
		rdkafka := open(t, newLibrdkafkaProducer(t, c.Addr(), txnID))
		if got := rdkafka.readNote(t, place); got != "goharvest/2:second" {
			t.Fatalf("the librdkafka producer read %q, want the franz producer's note", got)
		}
	})

	// As TestNoteOfAFailedTransactionNeverCommits: kgo sends no EndTxn for a transaction whose
	// every message failed before AddPartitionsToTxn, so the producer ends the note's itself.
	t.Run("NoteOfAFailedTransactionNeverCommits", func(t *testing.T) {
		noteOfAFailedTransactionNeverCommits(t, c, name("failed-note"), newTV1Producer)
	})

	// A producer fenced by a newer one of its transactional ID (a newer epoch) has its messages,
	// its note and its commit refused, fatally, and nothing it sent is committed.
	t.Run("FencedProducerIsRefused", func(t *testing.T) {
		topic := c.Topic(t, name("fenced"), 1)
		place := driver.NotePlace{Group: name("fenced"), Topic: topic}
		txnID := name("fenced")
		old := open(t, newTV1Producer(t, txnID))
		old.publish(t, place, "goharvest/2:before", driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("before")})
		if err := old.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		if err := old.send(driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("in flight")}); err != nil {
			t.Fatal(err)
		}
		old.await(t, 1)
		newer := open(t, newTV1Producer(t, txnID)) // InitProducerID: a newer epoch, the old transaction aborted
		var txnErr *driver.TxnError
		if err := old.WriteNote(timeout(t, 30*time.Second), place, "goharvest/2:deposed"); !errors.As(err, &txnErr) || !txnErr.Fatal {
			t.Errorf("the fenced producer's WriteNote returned %v, want a fatal TxnError", err)
		}
		if err := old.CommitTransaction(timeout(t, 30*time.Second)); !errors.As(err, &txnErr) || !txnErr.Fatal {
			t.Fatalf("the fenced producer's commit returned %v, want a fatal TxnError", err)
		}
		if err := old.BeginTransaction(); !errors.As(err, &txnErr) || !txnErr.Fatal {
			t.Errorf("BeginTransaction after the fatal commit returned %v, want a fatal TxnError", err)
		}
		if got := newer.readNote(t, place); got != "goharvest/2:before" {
			t.Errorf("the newer producer read %q, want the note before the fencing", got)
		}
		if got := kafkatest.ReadCommitted(t, c.Addr(), topic, 2, 5*time.Second); len(got) != 1 || string(got[0].Value) != "before" {
			t.Errorf("a consumer received %d messages (%v), want only the one committed before the fencing", len(got), got)
		}
	})

	t.Run("TransactionVersionRaisedWhileProducing", func(t *testing.T) { transactionVersionRaisedWhileProducing(t, c) })
}

// transactionVersion returns the transaction.version the cluster at addr has finalized.
func transactionVersion(t *testing.T, addr string) int16 {
	t.Helper()
	cl := plainClient(t, addr)
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(timeout(t, 30*time.Second), cl)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "transaction.version" {
			return f.MaxVersionLevel
		}
	}
	return 0
}

// committedMetadata returns the metadata of place's committed offset, as a consumer of the group
// sees it (OffsetFetch, read_committed).
func committedMetadata(t *testing.T, addr string, place driver.NotePlace) string {
	t.Helper()
	cl := plainClient(t, addr)
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group, req.RequireStable = place.Group, true
	rt := kmsg.NewOffsetFetchRequestTopic()
	rt.Topic, rt.Partitions = place.Topic, []int32{place.Partition}
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(timeout(t, 30*time.Second), cl)
	if err != nil {
		t.Fatal(err)
	}
	topics := resp.Topics
	if len(resp.Groups) > 0 {
		for _, gt := range resp.Groups[0].Topics {
			for _, pt := range gt.Partitions {
				if pt.Partition == place.Partition && pt.Metadata != nil {
					return *pt.Metadata
				}
			}
		}
	}
	for _, tt := range topics {
		for _, pt := range tt.Partitions {
			if pt.Partition == place.Partition && pt.Metadata != nil {
				return *pt.Metadata
			}
		}
	}
	return ""
}

// requestCounter is a kgo hook that counts the requests its clients write, by key.
type requestCounter struct {
	mu   sync.Mutex
	sent map[int16]int
}

func (r *requestCounter) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sent == nil {
		r.sent = map[int16]int{}
	}
	r.sent[key]++
}

func (r *requestCounter) count(key kmsg.Key) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent[int16(key)]
}

var _ kgo.HookBrokerWrite = (*requestCounter)(nil)

// A cluster whose transaction.version is raised to 2 while the producer runs (as
// kafka-features.sh upgrade does): kgo opts in to KIP-890 part 2 at a transaction's end once a
// new connection shows it the feature, while the producer writes its notes as it found at
// InitTransactions (AddOffsetsToTxn, TxnOffsetCommit v4), which a transaction of the second
// protocol accepts too. Its notes commit and abort with their transactions, and the next producer
// of the ID, which finds the second protocol, reads the last committed one. It runs on
// TestFirstTransactionProtocol's cluster, last, as it raises the version.
func transactionVersionRaisedWhileProducing(t *testing.T, c *kafkacluster.Cluster) {
	run := time.Now().UnixNano()
	topic := c.Topic(t, fmt.Sprintf("franz-tv-raised-%d", run), 1)
	place := driver.NotePlace{Group: fmt.Sprintf("franz-tv-raised-%d", run), Topic: topic}
	txnID := fmt.Sprintf("franz-tv-raised-%d", run)
	msg := driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("v")}
	logs := &logRecorder{}
	// kgo learns the cluster's features from ApiVersions, on each new connection: connections
	// idle for a second are closed, so that it learns of the upgrade within the test.
	conns := &connCounter{}
	cfg := franz.Config{SeedBrokers: []string{c.Addr()}, Opts: []kgo.Opt{kgo.ConnIdleTimeout(time.Second), kgo.WithHooks(conns)}}
	prod, err := franz.New(cfg).NewProducer(driver.ProducerConfig{TransactionalID: txnID, ClientID: "franz-tv-raised",
		DeliveryTimeout: 30 * time.Second, Logger: slog.New(logs)})
	if err != nil {
		t.Fatal(err)
	}
	p := open(t, prod)
	p.publish(t, place, "goharvest/2:tv1", msg)
	setTransactionVersion(t, c.Addr(), 2)
	if level := transactionVersion(t, c.Addr()); level != 2 {
		t.Fatalf("the cluster's transaction.version is %d after the upgrade, want 2", level)
	}
	testwait.For(t, 30*time.Second, "the producer's connections to idle out", func() bool { return conns.open() == 0 })
	for i := range 3 {
		p.publish(t, place, fmt.Sprintf("goharvest/2:tv2-%d", i), msg)
	}
	if !logs.logged("opting in") {
		t.Fatal("kgo did not log that it opted in to KIP-890 part 2 after the upgrade (has its message changed?)")
	}
	// An aborted note after the change.
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := p.send(msg); err != nil {
		t.Fatal(err)
	}
	p.await(t, 1)
	if err := p.WriteNote(timeout(t, 30*time.Second), place, "goharvest/2:aborted"); err != nil {
		t.Fatalf("WriteNote: %v", err)
	}
	if err := p.AbortTransaction(timeout(t, 30*time.Second)); err != nil {
		t.Fatalf("AbortTransaction: %v", err)
	}
	p.publish(t, place, "goharvest/2:last", msg)
	if got := open(t, newProducer(t, c.Addr(), txnID)).readNote(t, place); got != "goharvest/2:last" {
		t.Fatalf("the next producer read %q, want the last committed note", got)
	}
}

// logRecorder is a slog.Handler that keeps the messages logged.
type logRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) logged(substr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.Contains(m, substr) {
			return true
		}
	}
	return false
}

// setTransactionVersion upgrades (or downgrades) the cluster's transaction.version to level.
func setTransactionVersion(t *testing.T, addr string, level int16) {
	t.Helper()
	cl := plainClient(t, addr)
	req := kmsg.NewPtrUpdateFeaturesRequest()
	req.TimeoutMillis = 30_000
	f := kmsg.NewUpdateFeaturesRequestFeatureUpdate()
	f.Feature, f.MaxVersionLevel = "transaction.version", level
	f.UpgradeType = 1 // upgrade; 2 safe downgrade
	if level < transactionVersion(t, addr) {
		f.UpgradeType = 2
	}
	req.FeatureUpdates = append(req.FeatureUpdates, f)
	resp, err := req.RequestWith(timeout(t, 30*time.Second), cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	for _, r := range resp.Results {
		if err == nil {
			err = kerr.ErrorForCode(r.ErrorCode)
		}
	}
	if err != nil {
		t.Fatalf("update transaction.version to %d: %v", level, err)
	}
}

// connCounter is a kgo hook that counts its client's open connections.
type connCounter struct{ n atomic.Int32 }

func (c *connCounter) OnBrokerConnect(_ kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil {
		c.n.Add(1)
	}
}

func (c *connCounter) OnBrokerDisconnect(kgo.BrokerMetadata, net.Conn) { c.n.Add(-1) }

func (c *connCounter) open() int32 { return c.n.Load() }

var (
	_ kgo.HookBrokerConnect    = (*connCounter)(nil)
	_ kgo.HookBrokerDisconnect = (*connCounter)(nil)
)
