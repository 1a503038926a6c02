package owner

import (
	"testing"
	"time"
)

// An owner whose election can rest (driver.RestingElector) pulses as seldom as the election asks
// once its epochs run, up to a quarter of the heartbeat timeout, and at once when the election
// wakes it; while an epoch start hangs it pulses every MinPollInterval, whatever the election
// would allow.
func TestOwnerRestsWhileAtRest(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		limits := fastLimits() // MinPollInterval 10ms, HeartbeatTimeout 1s
		r := newRig(t, limits)
		// Longer than the test: the loop rests as long as the owner allows, a quarter of the
		// heartbeat timeout, unless something wakes it.
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

		// At rest: the epoch runs, and the loop waits as long as the owner allows, 250ms, not the
		// hour the election asked for: over longer than Healthy's two heartbeat timeouts it pulses
		// about ten times (250 at MinPollInterval), and Healthy holds.
		r.waitFor("the loop at rest", 5*time.Second, func() bool { return r.h.pulseAge() > 200*time.Millisecond })
		window := 2*limits.HeartbeatTimeout + 500*time.Millisecond
		if n := r.pulsesWithin(window); n < 3 || n > 30 {
			t.Fatalf("%d pulses in %v at rest; a rest bounded by a quarter of the heartbeat timeout gives about 10", n, window)
		}
		if err := r.h.Healthy(); err != nil {
			t.Fatalf("at rest: %v", err)
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
	})
}

// A rest counts from when the election says it (driver.RestingElector's Rest is "from now"), not
// from when the Pulse before it began: an election whose next heartbeat is due at a moment it
// names must be pulsed at that moment, not a Pulse's length before it, when it has nothing to do
// and the loop would pulse again only a MinPollInterval later, once more for every heartbeat.
func TestOwnerRestCountsFromWhenTheElectionAsks(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		limits := fastLimits() // MinPollInterval 10ms, HeartbeatTimeout 1s: rests of up to 250ms
		r := newRig(t, limits)
		r.elector.rest = 100 * time.Millisecond
		r.elector.pulseTakes = 100 * time.Millisecond
		ids := r.load(3, 3)
		r.start()
		r.elector.set(stateLeader)
		r.waitEmpty(10 * time.Second)
		r.checkOrder(ids)
		// The epoch runs (it published the records), so the loop is at rest. A Pulse and the rest after it take 200ms: 8 pulses in 1.6s. Counting the rest from the
		// Pulse's beginning gives one every 100ms, 16.
		if n := r.pulsesWithin(1600 * time.Millisecond); n < 4 || n > 11 {
			t.Fatalf("%d pulses in 1.6s, each taking 100ms and asking for a rest of 100ms after it; want about 8", n)
		}
	})
}
