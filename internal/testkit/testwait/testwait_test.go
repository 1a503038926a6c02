package testwait

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestUntilEndsWhenTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	start := time.Now()
	if !Until(10*time.Second, func() bool { return calls.Add(1) == 5 }) {
		t.Fatal("Until gave up on a condition that came true")
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Until took %v for a condition true at the fifth poll", took)
	}
}

func TestUntilGivesUpAtTheDeadline(t *testing.T) {
	start := time.Now()
	if Until(50*time.Millisecond, func() bool { return false }) {
		t.Fatal("Until reported a condition that never held")
	}
	if took := time.Since(start); took < 50*time.Millisecond || took > time.Second {
		t.Errorf("Until gave up after %v, want about 50ms", took)
	}
}

func TestThroughoutHoldsForTheWholeWindow(t *testing.T) {
	var calls atomic.Int32
	start := time.Now()
	if !Throughout(60*time.Millisecond, 5*time.Millisecond, func() bool { calls.Add(1); return true }) {
		t.Fatal("Throughout reported a condition that always held as broken")
	}
	if took := time.Since(start); took < 60*time.Millisecond || took > time.Second {
		t.Errorf("Throughout returned after %v, want about 60ms", took)
	}
	if n := calls.Load(); n < 5 {
		t.Errorf("%d polls in 60ms at 5ms intervals", n)
	}
}

func TestThroughoutEndsAtTheFirstBreak(t *testing.T) {
	var calls atomic.Int32
	start := time.Now()
	if Throughout(10*time.Second, time.Millisecond, func() bool { return calls.Add(1) < 3 }) {
		t.Fatal("Throughout reported a condition that broke at the third poll as held")
	}
	if took := time.Since(start); took > time.Second {
		t.Errorf("Throughout took %v to see a condition break at the third poll", took)
	}
}
