package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/outbox"
)

// ReadCommitted reads topic from the start, on any Kafka-protocol broker at addr, as a
// read_committed consumer until it has want messages or within has passed: what the producer
// contract's Committed asks of a test.
func ReadCommitted(t *testing.T, addr, topic string, want int, within time.Duration) []drivertest.Message {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var got []drivertest.Message
	for len(got) < want && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			m := drivertest.Message{Key: r.Key, Value: r.Value}
			for _, h := range r.Headers {
				m.Headers = append(m.Headers, outbox.Header{Key: h.Key, Value: string(h.Value)})
			}
			got = append(got, m)
		})
	}
	return got
}
