package dispatch

import (
	"testing"
	"testing/synctest"
	"time"
)

func TestEventsArriveInOrderAndEmitNeverBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var got []int
		d := New(func(e int) {
			if e == 0 {
				<-release // the handler blocks on the first event
			}
			got = append(got, e)
		})
		done := make(chan struct{})
		go func() {
			for i := range 1000 {
				d.Emit(i)
			}
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Emit blocked while the handler was busy")
		}
		close(release)
		d.Close()
		<-d.Done()
		if len(got) != 1000 {
			t.Fatalf("delivered %d events, want 1000", len(got))
		}
		for i, e := range got {
			if e != i {
				t.Fatalf("event %d is %d: out of order", i, e)
			}
		}
	})
}

func TestCloseWithNothingQueuedStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		d := New[string](nil)
		d.Close()
		select {
		case <-d.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("did not stop")
		}
	})
}
