// Package event holds what a harvester reports to its event handler
// (goharvest.Harvest.SetEventHandler): leadership changes, throughput readings, records that
// fail, are held, dropped or dead-lettered, and an outbox table that does not fit. Events arrive
// in the order they happen, on a goroutine of their own.
//
//	h.SetEventHandler(func(e event.Event) {
//		switch e := e.(type) {
//		case event.LeaderAcquired:
//			log.Printf("leading shard %d as %v", e.Shard, e.LeaderID)
//		case event.RecordFailed:
//			log.Printf("record %d held back: %v", e.ID, e.Err)
//		}
//	})
package event
