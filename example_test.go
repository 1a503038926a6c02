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
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/stasher"
)

// Read a harvester's configuration from YAML, as the reaper sidecar does. Unknown keys are
// errors; zero fields take their defaults.
func ExampleUnmarshal() {
	config, err := goharvest.Unmarshal([]byte(`
baseKafkaConfig:
  bootstrap.servers: localhost:9092
producerKafkaConfig:
  compression.type: lz4
leaderTopic: billing-api.leader
leaderGroupID: billing-api
dataSource: host=localhost port=5432 user=postgres dbname=billing sslmode=disable
outboxTable: billing.outbox
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
	fmt.Println(config.OutboxTable, config.Limits.HeartbeatTimeout, config.Limits.MaxPollInterval, config.Limits.SendConcurrency)
	// Output: billing.outbox 5s 2.5s 8
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
	config.BaseKafkaConfig["session.timeout.ms"] = 10000
	fmt.Println(config.Validate())
	// Output:
	// invalid harvest config: BaseKafkaConfig (baseKafkaConfig.session.timeout.ms): goharvest sets this property itself (derived from the heartbeat timeout so that a leader fences itself before its partition can be reassigned); remove it
	// Limits.MaxPollInterval (limits.maxPollInterval): 5s is out of range [100ms, 2.5s]: must be at least minPollInterval and at most half of heartbeatTimeout, so that a fenced leader has finished before another can be elected
}

// Create the outbox table if it does not exist yet.
func ExampleCreateOutboxTable() {
	if err := goharvest.CreateOutboxTable(context.Background(), exampleDataSource, "outbox"); err != nil {
		panic(err)
	}
	ddl, _ := goharvest.OutboxTableDDL("outbox")
	fmt.Println(ddl)
	// Output:
	// CREATE TABLE IF NOT EXISTS "outbox" (
	//   id                  BIGSERIAL PRIMARY KEY,
	//   create_time         TIMESTAMP WITH TIME ZONE NOT NULL,
	//   kafka_topic         VARCHAR(249) NOT NULL,
	//   kafka_key           VARCHAR(100) NOT NULL,  -- pick your own maximum key size
	//   kafka_value         VARCHAR(10000),         -- pick your own maximum value size
	//   kafka_header_keys   TEXT[] NOT NULL,
	//   kafka_header_values TEXT[] NOT NULL,
	//   leader_id           UUID
	// ) WITH (fillfactor = 80);
	// CREATE OR REPLACE FUNCTION goharvest_notify() RETURNS trigger LANGUAGE plpgsql AS $fn$
	// BEGIN
	//   PERFORM pg_notify(TG_ARGV[0], '');
	//   RETURN NULL;
	// END
	// $fn$;
	// DO $do$
	// BEGIN
	//   IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = '"outbox"'::regclass AND tgname = 'goharvest_notify') THEN
	//     CREATE TRIGGER goharvest_notify AFTER INSERT ON "outbox" FOR EACH STATEMENT EXECUTE FUNCTION goharvest_notify('goharvest.outbox');
	//   END IF;
	// END
	// $do$;
	// CREATE TABLE IF NOT EXISTS "outbox_dead_letters" (
	//   LIKE "outbox",
	//   error              TEXT NOT NULL,
	//   attempts           INTEGER NOT NULL,
	//   first_failure_time TIMESTAMP WITH TIME ZONE NOT NULL,
	//   last_failure_time  TIMESTAMP WITH TIME ZONE NOT NULL,
	//   dead_letter_time   TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
	//   PRIMARY KEY (id)
	// )
}

// Embed a harvester in a Go service. It joins the leader election, and while it leads it
// publishes the outbox until ctx ends.
func ExampleHarvest_Run() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := goharvest.CreateOutboxTable(ctx, exampleDataSource, "outbox"); err != nil {
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
	h, err := goharvest.New(goharvest.Config{
		BaseKafkaConfig: goharvest.KafkaConfigMap{"bootstrap.servers": bootstrapServers},
		DataSource:      dataSource,
		LeaderGroupID:   "order-service",
		LeaderTopic:     "order-service.leader",
	})
	if err != nil {
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
