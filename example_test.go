package goharvest_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// Read a harvester's settings from YAML, with the keys the reaper sidecar's file uses for them.
// Unknown keys are errors; zero fields take their defaults. The drivers, Store and Kafka, are
// set in code.
func ExampleUnmarshal() {
	config, err := goharvest.Unmarshal([]byte(`
leaderTopic: billing-api.leader
leaderGroupID: billing-api
shards: 4
limits:
  heartbeatTimeout: 5s
  maxInFlightRecords: 1000
`))
	if err != nil {
		panic(err)
	}
	config = config.WithDefaults()
	if err := config.Validate(); err != nil {
		panic(err)
	}
	fmt.Println(config.Shards, config.Limits.HeartbeatTimeout, config.Limits.MaxPollInterval, config.Limits.SendConcurrency)
	// Output: 4 5s 2.5s 8
}

// A misspelt key is reported with its line rather than silently ignored.
func ExampleUnmarshal_unknownKey() {
	_, err := goharvest.Unmarshal([]byte("limits:\n  heartbeatTimout: 5s\n"))
	fmt.Println(err)
	// Output: harvest config: line 2: unknown key "limits.heartbeatTimout"
}

// Validate names every offending field, its YAML key and the allowed range.
func ExampleConfig_Validate() {
	config := goharvest.Config{LeaderGroupID: "billing-api", LeaderTopic: "billing-api.leader", Name: "billing-1"}.WithDefaults()
	config.Limits.MaxPollInterval = config.Limits.HeartbeatTimeout
	config.Shards = 0
	fmt.Println(config.Validate())
	// Output:
	// invalid harvest config: Shards (shards): 0 is out of range [1, 256]
	// Limits.MaxPollInterval (limits.maxPollInterval): 5s is out of range [100ms, 2.5s]: must be at least minPollInterval and at most half of heartbeatTimeout, so that a fenced leader has finished before another can be elected
}

// Embed a harvester in a Go service. It joins the leader election, and while it leads it
// publishes the outbox until ctx ends.
func ExampleHarvest_Run() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := postgres.CreateOutboxTable(ctx, exampleDataSource, "outbox", outbox.TableOptions{}); err != nil {
		panic(err)
	}
	st, _ := stasher.New("outbox")
	pool, err := pgxpool.New(ctx, exampleDataSource)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	err = st.StashPgx(ctx, pool, goharvest.OutboxRecord{KafkaTopic: "orders", KafkaKey: "42", KafkaValue: goharvest.String("placed")})
	if err != nil {
		panic(err)
	}

	leading := make(chan struct{})
	var once sync.Once
	log.SetOutput(logWatcher(func(line string) {
		if strings.Contains(line, "leader acquired: ") {
			once.Do(func() { close(leading) })
		}
	}))
	defer log.SetOutput(os.Stderr)
	done := make(chan error, 1)
	go func() { done <- publishOutbox(ctx, exampleBootstrapServers, exampleDataSource) }()
	<-leading
	fmt.Println("leading")

	// Wait for the record to be published and purged.
	for {
		var rows int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&rows); err != nil {
			panic(err)
		}
		if rows == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond) // an example for users, so it polls as their code would
	}
	fmt.Println("published")
	cancel()
	if err := <-done; err != nil {
		panic(err)
	}
	// Output:
	// leading
	// published
}

// publishOutbox is what a Go service runs to publish its outbox, word for word what README.md and
// docs/getting-started.md show (TestDocsQuoteTheExamples holds them equal).
func publishOutbox(ctx context.Context, bootstrapServers, dataSource string) error {
	store, err := postgres.New(dataSource, "outbox")
	if err != nil {
		return err
	}
	h, err := goharvest.New(goharvest.Config{
		Store:         store, // the harvester disposes of it when it stops
		Kafka:         franz.New(franz.Config{SeedBrokers: []string{bootstrapServers}}),
		LeaderGroupID: "order-service",
		LeaderTopic:   "order-service.leader",
	})
	if err != nil {
		store.Dispose()
		return err
	}
	h.SetEventHandler(func(e event.Event) {
		switch e := e.(type) {
		case event.LeaderAcquired, event.LeaderRevoked, event.LeaderFenced:
			log.Println(e)
		case event.RecordFailed:
			log.Printf("record %d (key %s) cannot be published: %v", e.ID, e.Key, e.Err)
		}
	})
	return h.Run(ctx) // publishes while it leads, until ctx ends
}

// logWatcher passes each line the log package writes to see, and on to standard error.
type logWatcher func(line string)

func (w logWatcher) Write(p []byte) (int, error) {
	w(string(p))
	return os.Stderr.Write(p)
}
