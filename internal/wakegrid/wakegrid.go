// Package wakegrid times the periodic work of a process on one grid, so that the loops of many
// outboxes in one reaper wake together rather than each at a moment of its own. What an idle
// outbox costs a reaper is mostly its wakes (the kernel's task switches, the Go scheduler
// looking for work, its sysmon thread polling while any goroutine runs), not the work done in
// them: fifty loops that wake at one instant cost about what one does.
//
// The grid's origin is the process's start; a loop of period every wakes on the multiples of
// every after it. Loops of one period therefore wake together, and those of periods that divide
// one another on the longer period's points.
package wakegrid

import (
	"context"
	"time"
)

// origin is the grid's origin, shared by every loop of the process.
var origin = time.Now()

// Next returns the first point of the grid of period every strictly after t: at most every
// later, and never at t itself. every must be positive.
func Next(t time.Time, every time.Duration) time.Time {
	since := t.Sub(origin)
	n := since / every // the point at or before t, for t after the origin
	if since < 0 && since%every != 0 {
		n-- // division truncates towards zero
	}
	return origin.Add((n + 1) * every)
}

// Wait blocks until the next point of the grid of period every, and reports true; or until ctx
// ends first, and reports false.
func Wait(ctx context.Context, every time.Duration) bool {
	timer := time.NewTimer(time.Until(Next(time.Now(), every)))
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
