package epoch

import (
	"slices"
	"sync"
	"testing"
	"time"
)

// A mailbox hands over what was posted, in order, to whichever receiver takes it, without a
// sender ever waiting; closing it lets every receiver finish what is left and return.
func TestMailbox(t *testing.T) {
	m := newMailbox[int]()
	const n = 10_000
	for i := range n {
		m.post(i) // no receiver yet: must not block
	}
	var mu sync.Mutex
	var got [][]int
	var receivers sync.WaitGroup
	for range 2 {
		receivers.Go(func() {
			for {
				batch, ok := m.wait(7)
				if !ok {
					return
				}
				if len(batch) > 7 {
					t.Errorf("took %d, asked for at most 7", len(batch))
				}
				mu.Lock()
				got = append(got, batch)
				mu.Unlock()
			}
		})
	}
	m.post(n)
	m.close()
	m.post(n + 1) // dropped
	receivers.Wait()
	var all []int
	for _, b := range got {
		if !slices.IsSorted(b) {
			t.Fatalf("a batch out of order: %v", b)
		}
		all = append(all, b...)
	}
	slices.Sort(all)
	if len(all) != n+1 || all[0] != 0 || all[n] != n {
		t.Fatalf("received %d messages, want %d, each once", len(all), n+1)
	}
}

// The transaction loop is told when the transaction cannot grow: once the marker waits, nothing
// waits for a worker and every message has been reported, and not before.
func TestActivityWakesWhenStalled(t *testing.T) {
	a := activity{settled: closedChan(), wake: newWake()}
	woken := func() bool {
		select {
		case <-a.wake:
			return true
		default:
			return false
		}
	}
	f := &flight{}
	a.posted(1)
	a.producing(f)
	a.markerIdle(true)
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
	a.markerIdle(false)
	if a.stalled() {
		t.Fatal("stalled while the marker marks")
	}
}

// Under load an epoch spaces its commits by the busy epochs of its process (lingerFor), so that
