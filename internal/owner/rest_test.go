package owner

import (
	"testing"
	"time"
)

// An owner whose election can rest (driver.RestingElector) pulses as seldom as the election asks
// once its epochs run, and at once when the election wakes it; while an epoch start hangs it
// pulses every MinPollInterval, whatever the election would allow.
func TestOwnerRestsWhileAtRest(t *testing.T) {
	limits := fastLimits() // MinPollInterval 10ms
	r := newRig(t, limits)
	// Longer than the test: the loop pulses only when something wakes it.
	r.elector.rest = time.Hour
	ids := r.load(5, 5)
	r.kafka.initHang = true
	r.start()
	r.elector.set(stateLeader)
	if n := r.pulsesWithin(500 * time.Millisecond); n < 10 {
		t.Fatalf("%d pulses in 500ms while the epoch start hung; MinPollInterval 10ms allows about 50", n)
	}
	r.kafka.mu.Lock()
	r.kafka.initHang = false
	r.kafka.mu.Unlock()
	r.waitEmpty(10 * time.Second)
	r.checkOrder(ids)

	// At rest: the epoch runs, and the loop waits for the election.
	r.waitFor("the loop at rest", 5*time.Second, func() bool { return r.h.pulseAge() > 200*time.Millisecond })
	if n := r.pulsesWithin(300 * time.Millisecond); n > 0 {
		t.Fatalf("%d pulses in 300ms at rest; the election asked for none", n)
	}
	// Records written at rest are the epoch's business, not the loop's.
	more := r.load(3, 3)
	r.waitEmpty(10 * time.Second)
	r.checkOrder(append(ids, more...))

	// A revoke wakes the loop, which runs the barrier at once.
	r.elector.revoke()
	r.waitFor("the revoke", 5*time.Second, func() bool { return r.elector.revokeDone() && !r.h.IsLeader() })
	r.elector.set(stateLeader)
	r.waitFor("leadership again", 5*time.Second, r.h.IsLeader)
	if took := r.timeStop(); took > 2*limits.HeartbeatTimeout {
		t.Errorf("Stop took %v at rest", took)
	}
}
