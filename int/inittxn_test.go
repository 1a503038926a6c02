package int

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/librdkafka"
	"github.com/goharvest/goharvest/internal/kafkacluster"
)

// A successor's InitTransactions while its predecessor's transaction is still open: the
// coordinator fences the predecessor, aborts its transaction and refuses the successor
// (CONCURRENT_TRANSACTIONS) until the abort is written. librdkafka asks again only after 500ms of
// its own; the successor must ask again sooner, so that it starts about when the abort is done.
func TestSuccessorInitTransactionsRetriesPromptly(t *testing.T) {
	c := kafkacluster.Shared(t)
	topic := c.Topic(t, fmt.Sprintf("inittxn%d.events", rigs.Add(1)), 8)
	txnID := topic + ".txn"
	producer := func(name string, logger *slog.Logger) (driver.KafkaProducer, error) {
		return librdkafka.New(librdkafka.Config{Properties: map[string]any{"bootstrap.servers": c.Addr(), "client.id": name, "linger.ms": 0}}).
			NewProducer(driver.ProducerConfig{TransactionalID: txnID, Logger: logger})
	}
	initTxn := func(p driver.KafkaProducer) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.InitTransactions(ctx); err != nil {
			t.Fatal(err)
		}
	}

	predecessor, err := producer("predecessor", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	initTxn(predecessor)
	if err := predecessor.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		for predecessor.Produce(driver.Message{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}) != nil {
			time.Sleep(10 * time.Millisecond) // the topic's metadata arriving
		}
	}
	for range 50 {
		if d := <-predecessor.Deliveries(); d.Err != nil {
			t.Fatal(d.Err)
		}
	}
	// The predecessor stays open, its transaction under way, as a killed process's would.
	defer func() {
		predecessor.Abandon()
		go func() {
			for range predecessor.Deliveries() {
			}
		}()
		predecessor.Close()
	}()

	logs := &refusals{}
	successor, err := producer("successor", slog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	defer successor.Close()
	initTxn(successor)
	done := time.Now()
	attempts := logs.times()
	if len(attempts) == 0 {
		t.Skip("the coordinator did not refuse the successor: the predecessor's transaction was aborted before it asked")
	}
	attempts = append(attempts, done)
	var gaps []time.Duration
	for i := 1; i < len(attempts); i++ {
		gaps = append(gaps, attempts[i].Sub(attempts[i-1]))
	}
	slices.Sort(gaps)
	t.Logf("refused %d times over %v; gaps between attempts %v", len(attempts)-1, done.Sub(attempts[0]).Round(time.Millisecond), gaps)
	if median := gaps[len(gaps)/2]; median >= 450*time.Millisecond {
		t.Errorf("the successor asked again every %v (median), at librdkafka's own 500ms pace rather than promptly", median.Round(time.Millisecond))
	}
}

// refusals is a slog handler that records when librdkafka said it was refused a producer ID.
type refusals struct {
	mu sync.Mutex
	at []time.Time
}

func (r *refusals) Enabled(context.Context, slog.Level) bool { return true }
func (r *refusals) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, "Failed to acquire transactional PID") {
		r.mu.Lock()
		r.at = append(r.at, rec.Time)
		r.mu.Unlock()
	}
	return nil
}
func (r *refusals) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *refusals) WithGroup(string) slog.Handler      { return r }

func (r *refusals) times() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.at)
}
