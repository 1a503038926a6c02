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
