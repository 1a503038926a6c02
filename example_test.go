package goharvest_test

import (
	"context"
	"fmt"
	"log"
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

// Where ExampleHarvest_Run finds Postgres and Kafka: a service's own settings. Under go test,
// TestMain (main_test.go) points them at a throwaway database and Apache Kafka.
var (
	exampleDataSource       = "host=localhost port=5432 user=postgres dbname=postgres sslmode=disable"
	exampleBootstrapServers = "localhost:9092"
)

// Embed a harvester in a Go service. It joins the leader election, and while it leads it
// publishes the outbox until ctx ends.
//
// The example assumes a Postgres at exampleDataSource and Kafka at exampleBootstrapServers
// (declared above; a Kafka of one broker needs the settings in docs/getting-started.md). It creates
// the outbox table, writes a record with package stasher, and learns from the harvester's events
// when it leads. examples/embed is a service's harvester as a complete program, and
// examples/stasher a service that writes the records.
func ExampleHarvest_Run() {
	// A minute for all of it: a service's harvester runs until the service stops.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The outbox, and a record in it, as a service writes it in the transaction of its change.
	if err := postgres.CreateOutboxTable(ctx, exampleDataSource, "outbox", outbox.TableOptions{}); err != nil {
		panic(err)
	}
	pool, err := pgxpool.New(ctx, exampleDataSource)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	st, err := stasher.New("outbox")
	if err != nil {
		panic(err)
	}
	err = st.StashPgx(ctx, pool, goharvest.OutboxRecord{KafkaTopic: "orders", KafkaKey: "42", KafkaValue: goharvest.String("placed")})
	if err != nil {
		panic(err)
	}

	// The harvester, with its drivers: the outbox's store and the Kafka client.
	store, err := postgres.New(exampleDataSource, "outbox")
	if err != nil {
		panic(err)
	}
	h, err := goharvest.New(goharvest.Config{
		Store:         store, // the harvester disposes of it when it stops
		Kafka:         franz.New(franz.Config{SeedBrokers: []string{exampleBootstrapServers}}),
		LeaderGroupID: "order-service",
		LeaderTopic:   "order-service.leader",
	})
	if err != nil {
		store.Dispose()
		panic(err)
	}
	leading := make(chan struct{}, 1)
	h.SetEventHandler(func(e event.Event) {
		switch e := e.(type) {
		case event.LeaderAcquired:
			select {
			case leading <- struct{}{}:
			default: // told already
			}
		case event.RecordFailed:
			log.Printf("record %d (key %s) cannot be published: %v", e.ID, e.Key, e.Err)
		}
	})
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }() // publishes while it leads, until ctx ends

	select {
	case <-leading:
		fmt.Println("leading")
	case err := <-done:
		panic(fmt.Sprintf("the harvester stopped before it led: %v", err))
	}
	// Wait for the record to be published and its row deleted.
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
