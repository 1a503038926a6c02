package wakegrid

import (
	"context"
	"testing"
	"time"
)

func TestNextIsTheFirstPointAfter(t *testing.T) {
	const every = 100 * time.Millisecond
	for _, offset := range []time.Duration{-3 * every, -every / 2, 0, 1, every - 1, every, 7*every + every/3} {
		at := origin.Add(offset)
		next := Next(at, every)
		if !next.After(at) || next.Sub(at) > every {
			t.Errorf("Next(origin%+v) = origin%+v; want within (0, %v] after", offset, next.Sub(origin), every)
		}
		if r := next.Sub(origin) % every; r != 0 {
			t.Errorf("Next(origin%+v) = origin%+v: %v off the grid", offset, next.Sub(origin), r)
		}
	}
}

// Loops of one period that start at different moments wake at the same instants.
func TestLoopsOfOnePeriodWakeTogether(t *testing.T) {
	const every = 20 * time.Millisecond
	a, b := Next(time.Now(), every), Next(time.Now().Add(every/3), every)
	if !a.Equal(b) && b.Sub(a) != every {
		t.Errorf("two loops a third of a period apart wake at %v and %v; want the same point or the next", a, b)
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if Wait(ctx, time.Hour) {
		t.Fatal("Wait reported the grid's point with its context ended")
	}
	if !Wait(t.Context(), time.Millisecond) {
		t.Fatal("Wait reported an ended context for a live one")
	}
}
