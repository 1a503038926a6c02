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
// a shard publishes it, and the others stand by:
//
//	h, err := goharvest.New(goharvest.Config{
//		BaseKafkaConfig: goharvest.KafkaConfigMap{"bootstrap.servers": "localhost:9092"},
//		DataSource:      "host=localhost dbname=orders",
//		LeaderGroupID:   "order-service",
//	})
//	if err != nil {
//		return err
//	}
//	return h.Run(ctx) // publishes while it leads, until ctx ends
//
// ExampleHarvest_Run is the whole of it, run by go test. Config documents every setting and its
// default; Unmarshal reads one from YAML as the reaper does, and Validate names each field it
// refuses. Harvest reports what it does through events (package event), Prometheus metrics and
// OpenTelemetry spans, and answers liveness and readiness probes (Healthy, Ready).
//
// # Drivers
//
// The engine reaches the outbox and Kafka through the interfaces of package driver; its
// drivers are packages of their own: the Postgres store (driver/postgres, on pgx, the default)
// and the Kafka client that Config.KafkaClient chooses: driver/franz, on franz-go in pure Go with
// an election of its own (the default), or driver/librdkafka, through confluent-kafka-go, with the
// election of package neli (in a build with cgo only). Config.DatabaseBindingProvider and
// Config.Kafka take others, and the root package itself builds without cgo.
//
// README.md and docs/ have the guarantees in full, the table's schema, operations and the figures.
package goharvest
