package pump

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/verify"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.After(pgtest.Run(kafkacluster.Around(m)))) }

func runMain(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := Main(ctx, args, &out, &out)
	return code, out.String()
}

func TestPumpWritesAndVerifiesThroughAHarvester(t *testing.T) {
	dsn := pgtest.NewOutbox(t)
	broker := kafkacluster.Shared(t)
	broker.Topic(t, "pump", 8)
	store, err := postgres.New(dsn, "outbox")
	if err != nil {
		t.Fatal(err)
	}
	h, err := goharvest.New(goharvest.Config{
		Store:         store,
		Kafka:         franz.New(franz.Config{SeedBrokers: []string{broker.Addr()}}),
		LeaderGroupID: "pump-test",
		LeaderTopic:   "pump-test.leader",
		Limits:        goharvest.Limits{HeartbeatTimeout: time.Second, MinPollInterval: 50 * time.Millisecond},
		Logger:        slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go h.Run(ctx)

	code, out := runMain(t, "-dsn", dsn, "-brokers", broker.Addr(), "-keys", "50", "-records", "3000",
		"-writers", "4", "-batch", "10", "-verify", "-timeout", "60s")
	if code != ExitOK {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	for _, want := range []string{"records expected 3000, arrived 3000", "lost: 0", "reversals: 0", "verdict: OK", "wrote 3000 records", "p99"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// The checker is only worth something if it catches what it is for: a crafted topic with a
// record missing and a key that goes backwards must fail verification.
func TestVerifyCatchesInjectedLossAndReversal(t *testing.T) {
	broker := kafkacluster.Shared(t)
	broker.Topic(t, "crafted", 1)
	p, err := kafka.NewProducer(&kafka.ConfigMap{"bootstrap.servers": broker.Addr(), "go.delivery.reports": false})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	topic := "crafted"
	produce := func(key string, seq int64) {
		rec := verify.Record(topic, key, "crafted-run", seq, goharvest.String(strconv.FormatInt(seq, 10)))
		var headers []kafka.Header
		for _, h := range rec.KafkaHeaders {
			headers = append(headers, kafka.Header{Key: h.Key, Value: []byte(h.Value)})
		}
		err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: 0},
			Key: []byte(key), Value: []byte(*rec.KafkaValue), Headers: headers}, nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, seq := range []int64{0, 1, 2, 1} { // key-0: 1 arrives again after 2
		produce("key-0", seq)
	}
	for _, seq := range []int64{0, 2} { // key-1: 1 never arrives
		produce("key-1", seq)
	}
	if remaining := p.Flush(10_000); remaining != 0 {
		t.Fatalf("%d messages not flushed", remaining)
	}

	code, out := runMain(t, "verify", "-brokers", broker.Addr(), "-topic", "crafted", "-run", "crafted-run",
		"-keys", "2", "-records", "6", "-timeout", "5s")
	if code != ExitFailed {
		t.Fatalf("exit %d for a topic with a loss and a reversal:\n%s", code, out)
	}
	for _, want := range []string{"lost: 1", "key key-1: 1", "reversals: 1", "key key-0: 1 arrived after 2", "verdict: FAILED"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}

	// A run of which nothing reached the topic is all loss.
	code, out = runMain(t, "verify", "-brokers", broker.Addr(), "-topic", "crafted", "-run", "another-run",
		"-keys", "1", "-records", "1", "-timeout", "2s")
	if code != ExitFailed || !strings.Contains(out, "lost: 1") {
		t.Fatalf("a run with no records on the topic passed: exit %d\n%s", code, out)
	}
}

func TestTimedRunWrites(t *testing.T) {
	dsn := pgtest.NewOutbox(t)
	code, out := runMain(t, "-dsn", dsn, "-records", "0", "-duration", "1s", "-keys", "10", "-writers", "2")
	if code != ExitOK {
		t.Fatalf("exit %d:\n%s", code, out)
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var n int
	conn.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&n)
	if n == 0 || !strings.Contains(out, "wrote "+strconv.Itoa(n)+" records") {
		t.Fatalf("%d rows in the outbox; output:\n%s", n, out)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, args := range [][]string{{"-keys", "0"}, {"-records", "0"}, {"verify", "-records", "10"}, {"-nope"}} {
		if code, out := runMain(t, args...); code != ExitUsage {
			t.Errorf("%v: exit %d\n%s", args, code, out)
		}
	}
}

func TestExpectedSpreadsRecordsOverKeys(t *testing.T) {
	got := Expected(10, 4)
	want := map[string]int64{"key-0": 3, "key-1": 3, "key-2": 2, "key-3": 2}
	for k, n := range want {
		if got[k] != n {
			t.Errorf("%s: %d, want %d", k, got[k], n)
		}
	}
}
