// Package goharvest publishes the rows of a Postgres transactional outbox to Kafka: at least
// once, in order per key, with one publisher per shard elected through Kafka, deleting each row
// once Kafka has durably acknowledged it.
//
// # Writing rows
//
// An application inserts a row into the outbox table in the same transaction as its business
// data, so that the message exists exactly when the data does. Package stasher does that in the
// caller's transaction (database/sql or pgx) without importing the harvester; plain SQL works as
// well. CreateOutboxTable and OutboxTableDDL give the table.
//
// # Publishing them
//
// Every instance of a service runs a Harvest (or the reaper sidecar runs one beside a service in
// any language). The harvesters of an outbox form one Kafka consumer group; whoever Kafka assigns
// a shard publishes it, and the others stand by. A harvester takes its drivers as values, the
// outbox's and the Kafka client's, so a program links only the ones it names:
//
//	store, err := postgres.New("host=localhost dbname=orders", "outbox") // package driver/postgres
//	if err != nil {
//		return err
//	}
//	h, err := goharvest.New(goharvest.Config{
//		Store:         store,
//		Kafka:         franz.New(franz.Config{SeedBrokers: []string{"localhost:9092"}}), // package driver/franz
//		LeaderGroupID: "order-service",
//	})
//	if err != nil {
//		store.Dispose()
//		return err
//	}
//	return h.Run(ctx) // publishes while it leads, until ctx ends
//
// ExampleHarvest_Run is the whole of it, run by go test, and examples/embed a program to copy.
// Config documents every setting and its default; Unmarshal reads the settings from YAML as the
// reaper does, and Validate names each field it refuses. Harvest reports what it does through
// events (package event), Prometheus metrics and OpenTelemetry spans, and answers liveness and
// readiness probes (Healthy, Ready).
//
// # Drivers
//
// The engine reaches the outbox and Kafka through the interfaces of package driver; its drivers
// are packages of their own, which this package does not import: the Postgres store
// (driver/postgres, on pgx), the Kafka clients driver/franz (franz-go, pure Go, with an election
// of its own) and driver/librdkafka (confluent-kafka-go, which needs cgo, with the election of
// package neli), and the in-memory driver/memory for tests. Any driver.Store or driver.Kafka
// serves.
//
// README.md and docs/ have the guarantees in full, the table's schema, operations and the
// figures.
package goharvest
