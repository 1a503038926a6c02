// Package memory is an in-memory driver for goharvest's engine: an outbox (Store), a Kafka broker
// with transactional producers (Broker, Producer) and a leader election (Election, Elector), each
// implementing its interface of package driver and passing the same contract suite
// (package drivertest) as the Postgres, librdkafka and neli drivers.
//
// It is for tests: of the engine, of code built on goharvest, and of a new driver's expectations.
// Nothing is persisted, and it imports no cgo and no database driver, so tests that use it build
// with CGO_ENABLED=0 and need neither Postgres nor Kafka:
//
//	store := memory.NewStore()
//	store.Insert(driver.OutboxRecord{KafkaTopic: "orders", KafkaKey: "42", KafkaValue: &value})
//	broker := memory.NewBroker()
//	election := memory.NewElection(1)
//	// ... a harvester on store and memory.Kafka{Broker: broker, Election: election} ...
//	for _, m := range broker.Committed() { ... }
//
// Besides the driver methods, each type has methods a test uses to play the writer, the operator
// or the fault: Store.Update and Store.SetMalformed change rows, Broker.SetRefuse makes Kafka
// refuse messages, Elector.Revoke and Elector.Fence take leadership away. They are marked as test
// hooks in their comments; the engine never calls them. Faults that only one test suite needs
// (a database that hangs, commits that time out) are best written in that suite, wrapping these
// types, as the engine's own tests (internal/engine/owner) do.
package memory
