// Package testwait lets tests wait for a state by polling it until a deadline, instead of
// sleeping for a guessed time: a wait ends as soon as the state is reached, and one that is never
// reached fails the test, saying what it waited for, rather than hanging. Tests only import it.
package testwait

import (
	"testing"
	"time"
)

// maxInterval bounds the pause between two polls: short enough that a wait ends soon after the
// state is reached, long enough that a condition that queries Postgres does not load it.
const maxInterval = 20 * time.Millisecond

// Until polls cond, first at once and then at growing intervals up to maxInterval, until it
// holds (true) or within has passed (false).
func Until(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for interval := time.Millisecond; ; interval = min(2*interval, maxInterval) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
}

// UntilEvery polls cond every interval until it holds (true) or within has passed (false), for
// waits whose length a test measures, where the pause between polls is the measure's resolution.
func UntilEvery(within, interval time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(within); !cond(); time.Sleep(interval) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// For polls cond like Until and fails tb when within passes first, naming what it waited for.
func For(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Until(within, cond) {
		tb.Fatalf("timed out after %v waiting for %s", within, what)
	}
}

// Throughout polls cond every interval for the whole of d and reports whether it held at every
// poll, returning false at the first that it did not: for a state that must last (a leader that
// keeps leading, a count that must not grow), where Until would end at the first poll.
func Throughout(d, interval time.Duration, cond func() bool) bool {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for end := time.Now().Add(d); ; <-tick.C {
		if !cond() {
			return false
		}
		if !time.Now().Before(end) {
			return true
		}
	}
}
