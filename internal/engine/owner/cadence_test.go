package owner

import (
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/internal/wakegrid"
)

// A revoke, or Stop, that comes while a transaction waits out the commit cadence (here its
// longest, 1s) is served at once: the epoch ends without waiting for the cadence, its waiting
// record is committed and purged on the way, and the handover takes a fraction of the cadence.
// (Real time: the owner loop and the election run here, which internal/engine/epoch's synctest tests
// leave out.)
func TestCommitCadenceDoesNotDelayTheHandover(t *testing.T) {
	const cadence = time.Second
	for _, how := range []string{"revoke", "Stop"} {
		t.Run(how, func(t *testing.T) {
			limits := fastLimits()
			limits.CommitCadence = cadence
			r := newRig(t, limits)
			r.start()
			r.waitFor("leadership", 5*time.Second, r.h.IsLeader)
			// Written just after a point of the cadence's grid, the record waits for the next.
			time.Sleep(time.Until(wakegrid.Next(time.Now(), cadence)))
			ids := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "k", KafkaValue: String("v")})
			r.waitFor("the record to be claimed", time.Second, func() bool { return r.h.InFlightRecords() == 1 })
			if !testwait.Throughout(50*time.Millisecond, time.Millisecond, func() bool { return r.db.exists(ids[0]) }) {
				t.Fatal("the record was purged before the cadence; the test would show nothing")
			}
			began := time.Now()
			switch how {
			case "revoke":
				r.elector.revoke()
				r.waitFor("the revoke", 5*time.Second, func() bool { return r.elector.revokeDone() && !r.h.IsLeader() })
			case "Stop":
				r.stop()
			}
			took := time.Since(began)
			if r.db.exists(ids[0]) {
				t.Errorf("the waiting record is still in the outbox after the %s", how)
			}
			// Within the handover's bound (MaxPollInterval, 500ms here), half the cadence.
			if bound := limits.WithDefaults().MaxPollInterval; took > bound {
				t.Errorf("the %s took %v while a transaction waited out a cadence of %v", how, took, cadence)
			}
		})
	}
}
