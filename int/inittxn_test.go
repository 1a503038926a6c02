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

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/driver/librdkafka"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// A successor's InitTransactions while its predecessor's transaction is still open: the
// coordinator fences the predecessor, aborts its transaction and refuses the successor
// (CONCURRENT_TRANSACTIONS) until the abort is written. librdkafka asks again only after 500ms of
// its own; the successor must ask again sooner, so that it starts about when the abort is done.
// kgo (the franz client) asks again after 20ms, 200ms once refused for a second.
func TestSuccessorInitTransactionsRetriesPromptly(t *testing.T) {
	for _, client := range []string{"franz", "librdkafka"} {
		t.Run(client, func(t *testing.T) {
			successorRetriesPromptly(t, client)
		})
	}
}

func successorRetriesPromptly(t *testing.T, client string) {
	c := kafkacluster.Shared(t)
	topic := c.Topic(t, fmt.Sprintf("inittxn%d.events", rigs.Add(1)), 8)
	txnID := topic + ".txn"
	// attempts are the times the successor asked for its producer ID, each refusal's and the last.
	attempts := &timesOf{}
	producer := func(name string, successor bool) (driver.KafkaProducer, error) {
		cfg := driver.ProducerConfig{TransactionalID: txnID, Logger: slog.New(slog.DiscardHandler)}
		if client == "franz" {
			var opts []kgo.Opt
			if successor {
				opts = append(opts, kgo.WithHooks(initProducerIDWrites{attempts}))
			}
			return franz.New(franz.Config{SeedBrokers: strings.Split(c.Addr(), ","), ClientID: name, Linger: franz.NoLinger, ProducerOpts: opts}).NewProducer(cfg)
		}
		if successor {
			cfg.Logger = slog.New(refusals{attempts})
		}
		return librdkafka.New(librdkafka.Config{Properties: map[string]any{"bootstrap.servers": c.Addr(), "client.id": name, "linger.ms": 0}}).
			NewProducer(cfg)
	}
	initTxn := func(p driver.KafkaProducer) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := p.InitTransactions(ctx); err != nil {
			t.Fatal(err)
		}
	}

	predecessor, err := producer("predecessor", false)
	if err != nil {
		t.Fatal(err)
	}
	initTxn(predecessor)
	if err := predecessor.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		m := driver.Message{Topic: topic, Key: fmt.Appendf(nil, "k%d", i), Value: []byte("v")}
		testwait.For(t, 30*time.Second, "the topic's metadata, to queue a message", func() bool { return predecessor.Produce(m) == nil })
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

	successor, err := producer("successor", true)
	if err != nil {
		t.Fatal(err)
	}
	defer successor.Close()
	initTxn(successor)
	done := time.Now()
	asked := attempts.times()
	if client == "librdkafka" {
		asked = append(asked, done) // librdkafka logs each refusal; the last attempt is the one that returned
	}
	if len(asked) < 2 {
		t.Skip("the coordinator did not refuse the successor: the predecessor's transaction was aborted before it asked")
	}
	var gaps []time.Duration
	for i := 1; i < len(asked); i++ {
		gaps = append(gaps, asked[i].Sub(asked[i-1]))
	}
	slices.Sort(gaps)
	t.Logf("refused %d times over %v; gaps between attempts %v", len(asked)-1, done.Sub(asked[0]).Round(time.Millisecond), gaps)
	if median := gaps[len(gaps)/2]; median >= 450*time.Millisecond {
		t.Errorf("the successor asked again every %v (median), at librdkafka's own 500ms pace or slower rather than promptly", median.Round(time.Millisecond))
	}
}

// timesOf collects the times something happened, from any goroutine.
type timesOf struct {
	mu sync.Mutex
	at []time.Time
}

func (r *timesOf) add(at time.Time) {
	r.mu.Lock()
	r.at = append(r.at, at)
	r.mu.Unlock()
}

func (r *timesOf) times() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.at)
}

// refusals is a slog handler that records when librdkafka said it was refused a producer ID.
type refusals struct{ *timesOf }

func (r refusals) Enabled(context.Context, slog.Level) bool { return true }
func (r refusals) Handle(_ context.Context, rec slog.Record) error {
	if strings.Contains(rec.Message, "Failed to acquire transactional PID") {
		r.add(rec.Time)
	}
	return nil
}
func (r refusals) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r refusals) WithGroup(string) slog.Handler      { return r }

// initProducerIDWrites is a kgo hook that records when kgo sent an InitProducerID request.
type initProducerIDWrites struct{ *timesOf }

// Were kgo's hook to change, the hook would never be called and the test would skip, not fail.
var _ kgo.HookBrokerWrite = initProducerIDWrites{}

func (h initProducerIDWrites) OnBrokerWrite(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	if key == int16(kmsg.InitProducerID) && err == nil {
		h.add(time.Now())
	}
}
