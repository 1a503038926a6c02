// Package seam holds the seams between goharvest's engine and its drivers: what the engine asks
// of the outbox's store (Store, with optional Features), of Kafka (KafkaProducer, Elector), and
// what it tells its user (Event). It is a leaf: it imports no driver, so the engine
// (internal/owner, internal/epoch) and its fakes (internal/fake) build without cgo, and the
// drivers (the root package's Postgres binding and confluent producer) implement these
// interfaces without importing the engine.
//
// The root package gives these types the names users know (goharvest.DatabaseBinding,
// goharvest.KafkaProducer, goharvest.LeaderAcquired, ...) as aliases; their documentation is
// here, and holds for both names.
package seam
