package owner

import (
	"fmt"
	"runtime/debug"
	"testing"
	"testing/synctest"
	"time"
)

// bubbleLimit bounds the wall time of one test run in a bubble: the rig's runs take milliseconds
// there, their windows passing on the bubble's clock.
const bubbleLimit = 2 * time.Minute

// inBubble runs f in a synctest bubble (synctest.Test), where the windows the engine's timing
// tests wait out pass on the bubble's clock, at no wall time.
//
// A bubble's clock moves only while every goroutine in it is durably blocked, and one waiting
// for a mutex is not: should a goroutine hold a mutex while it waits on the clock (the
// transaction loop holds txnMu through CommitTransaction, which waits for the fake broker's
// latency) and another wait for that mutex (a send worker's produce), the clock stops and the
// test hangs, in wall time, rather than failing. In the flows of the tests that run here no
// worker reaches txnMu while a commit waits, but a bug can change the flow; so a run that
// outlasts bubbleLimit is ended with a panic that says why, with every goroutine's stack,
// rather than left to the go test timeout.
func inBubble(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	done := make(chan struct{})
	defer close(done)
	// Started outside the bubble, so that its timer runs on the wall clock.
	go func() {
		select {
		case <-done:
		case <-time.After(bubbleLimit):
			debug.SetTraceback("all")
			panic(fmt.Sprintf("%s: its bubble made no progress in %v: a goroutine waiting for a mutex "+
				"that another holds while it waits on the bubble's clock stops that clock (see inBubble)",
				t.Name(), bubbleLimit))
		}
	}()
	synctest.Test(t, f)
}

// advanceTo moves the bubble's clock to at, once every goroutine in the bubble is blocked,
// letting what falls due before it run, and returns at: the tests in a bubble name the instants
// they look at. Outside a bubble it would be a sleep of real time; only bubbled tests call it.
func advanceTo(at time.Time) time.Time {
	time.Sleep(time.Until(at))
	return at
}
