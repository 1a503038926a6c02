// Command memory embeds a harvester with the in-memory driver (package driver/memory): no
// Postgres, no Kafka, and no cgo. It writes records of a few keys into an in-memory outbox,
// publishes them to an in-memory broker, and checks that each key's records arrived in order.
//
//	CGO_ENABLED=0 go run ./examples/memory
//
// It is the shape of a test of code built on goharvest: the harvester is the real engine, and
// only the drivers are in memory.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/memory"
)

func main() {
	if err := run(1000, 10); err != nil {
		fmt.Fprintln(os.Stderr, "memory:", err)
		os.Exit(1)
	}
}

func run(records, keys int) error {
	store := memory.NewStore()
	for i := range records {
		value := strconv.Itoa(i)
		store.Insert(driver.OutboxRecord{KafkaTopic: "orders", KafkaKey: "key-" + strconv.Itoa(i%keys), KafkaValue: &value})
	}
	kafka := memory.NewKafka(1)
	h, err := goharvest.New(goharvest.Config{
		Store:             store,
		Kafka:             kafka,
		LeaderGroupID:     "memory-example",
		LeaderTopic:       "memory-example.leader",
		Logger:            slog.New(slog.NewTextHandler(io.Discard, nil)),
		MetricsRegisterer: prometheus.NewRegistry(),
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	for store.Len() > 0 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond) // a program's own check, as a user's would poll
	}
	cancel()
	if err := <-done; err != nil {
		return err
	}
	if n := store.Len(); n > 0 {
		return fmt.Errorf("%d records left in the outbox after a minute", n)
	}
	last := map[string]int{}
	published := 0
	for _, m := range kafka.Broker.Committed() {
		v, err := strconv.Atoi(string(m.Value))
		if err != nil {
			return fmt.Errorf("record value %q: %w", m.Value, err)
		}
		if prev, ok := last[string(m.Key)]; ok && v < prev {
			return fmt.Errorf("key %s: record %d published after %d", m.Key, v, prev)
		}
		last[string(m.Key)] = v
		published++
	}
	if published < records {
		return fmt.Errorf("%d records published, want at least %d", published, records)
	}
	fmt.Printf("published %d records of %d keys in order, without cgo\n", published, len(last))
	return nil
}
