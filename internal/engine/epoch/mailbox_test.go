package epoch

import (
	"github.com/goharvest/goharvest/internal/engine/mailbox"
	"testing"
	"time"
)

// The transaction loop is told when the transaction cannot grow: once the marker waits, nothing
// waits for a worker and every message has been reported, and not before.
func TestActivityWakesWhenStalled(t *testing.T) {
	a := activity{settled: closedChan(), wake: mailbox.NewWake()}
	woken := func() bool { return poked(a.wake) }
	f := &flight{}
	a.posted(1)
	a.producing(f)
	a.markerWaits(markerRows)
	if woken() || a.stalled() {
		t.Fatal("stalled with a record waiting for its worker and a message unreported")
	}
	a.handled(1)
	if woken() || a.stalled() {
		t.Fatal("stalled with a message unreported")
	}
	if a.awaitReports(time.Now().Add(time.Millisecond)) {
		t.Fatal("awaitReports returned true with a message unreported")
	}
	a.reported(f, nil)
	if !woken() || !a.stalled() {
		t.Fatal("not told of the stall once the last report came in")
	}
	if !a.awaitReports(time.Now().Add(time.Hour)) {
		t.Fatal("awaitReports waited with every message reported")
	}
	a.markerWaits(markerBusy)
	if a.stalled() {
		t.Fatal("stalled while the marker marks")
	}
}

// Under load an epoch spaces its commits by the busy epochs of its process (lingerFor), so that

// The transaction loop is told when the load begins (a claim fills its room, or the marker waits
// for room), since a transaction waiting out the commit cadence then commits sooner; and the load
// ends with a claim that does not fill its room.
func TestActivityWakesWhenLoaded(t *testing.T) {
	a := activity{settled: closedChan(), wake: mailbox.NewWake()}
	woken := func() bool { return poked(a.wake) }
	a.posted(1) // a record on its way to a worker: the transaction has not stalled
	a.claimed(false)
	if woken() || a.loaded() {
		t.Fatal("loaded after a claim that did not fill its room")
	}
	a.claimed(true)
	if !woken() || !a.loaded() {
		t.Fatal("not told of a claim that filled its room")
	}
	a.claimed(false)
	if a.loaded() {
		t.Fatal("still loaded after a claim that did not fill its room")
	}
	a.markerWaits(markerRows)
	if woken() || a.loaded() {
		t.Fatal("loaded while the marker waits for rows")
	}
	a.markerWaits(markerRoom)
	if !woken() || !a.loaded() {
		t.Fatal("not told that the marker waits for room")
	}
}

// poked takes wake's token, if it has one, and reports whether it had.
func poked(wake mailbox.Wake) bool {
	select {
	case <-wake:
		return true
	default:
		return false
	}
}
