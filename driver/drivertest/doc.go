// Package drivertest holds goharvest's drivers to the contract the engine relies on: one suite
// per seam of package driver, each a table of named rules that every driver passes, the
// in-memory ones (package memory) included. A fake that broke a rule would let the engine's tests
// pass where the real driver fails, or the other way round.
//
// A driver, in this module or outside it, runs a suite from its own tests with a way to make
// fresh instances of what it drives:
//
//		func TestMyStoreContract(t *testing.T) {
//			drivertest.RunStore(t, func(t *testing.T) drivertest.Outbox {
//				s := mystore.Open(t) // an empty outbox
//				return drivertest.Outbox{Store: s, Insert: ..., SetValue: ..., Delete: ..., Exists: ..., InsertMalformed: ...}
//			})
//		}
//
//	  - RunStore: a driver.Store (and driver.Reader, when the store has it) on an empty outbox.
//	  - RunProducer: a driver.KafkaProducer on a broker, read back by a read_committed consumer.
//	  - RunElector: a driver.Elector among several contenders of one election.
//
// The suites need a real backend where the driver has one (this module runs them on Postgres and
// Apache Kafka in the root package's contract tests), and take seconds there, not milliseconds.
package drivertest
