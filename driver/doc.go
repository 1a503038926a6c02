// Package driver is the seam between goharvest's engine and its drivers: what the engine asks of
// the outbox's store and of Kafka. A driver implements these interfaces; the engine (the
// Harvest that package goharvest builds) calls them, and imports no driver itself.
//
// # The store
//
// A Store is the outbox table as the engine needs it: DatabaseBinding (mark, purge, reset) and
// HeldRowBinding (what holding back an unpublishable record takes). Every method carries
// correctness, so a store lacks none of them. What a store may also offer is optional, each an
// interface of its own, found once by FeaturesOf: Reader (claiming by reading, the default claim
// strategy), SchemaChecker, Listener (and CoveringListener), Pinger, BacklogSampler, Sharder,
// and, for a database that can fail over, RecoveryChecker, StandbyWaiter and ServerIdentifier.
//
// # Kafka
//
// A KafkaProducer publishes one leader epoch's records in transactions, under a transactional ID
// that every harvester of a shard shares, so that a new epoch fences every earlier one. Its
// transactions also carry the epoch's notes (NotePlace), which tell a successor what was
// published. An Elector is the leader election: whoever it says leads a shard publishes it. An
// elector may also be a Pinger, and a RestingElector, which says how long the engine's loop may
// go without pulsing it while the loop has nothing else to do.
//
// # Drivers
//
// Package driver/postgres is the Postgres store, on pgx; package driver/mysql the store for
// MySQL and MariaDB, on go-sql-driver/mysql (no Listener: the harvester polls); package
// driver/librdkafka a Kafka client on librdkafka (cgo), with the election of package neli;
// package driver/franz a Kafka client on franz-go, in pure Go, with an election of its own.
// Every driver is held to the same contract: package drivertest's suites (RunStore, RunProducer, RunElector) hold
// each store, producer and election, the in-memory ones of package memory included, to the rules
// the engine relies on, and a driver outside this module runs them from its own tests.
package driver
