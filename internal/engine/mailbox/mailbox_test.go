package mailbox

import (
	"slices"
	"sync"
	"testing"
)

// A mailbox hands over what was posted, in order, to whichever receiver takes it, without a
// sender ever waiting; closing it lets every receiver finish what is left and return.
func TestMailbox(t *testing.T) {
	m := New[int]()
	const n = 10_000
	for i := range n {
		m.Post(i) // no receiver yet: must not block
	}
	var mu sync.Mutex
	var got [][]int
	var receivers sync.WaitGroup
	for range 2 {
		receivers.Go(func() {
			for {
				batch, ok := m.Wait(7)
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
	m.Post(n)
	m.Close()
	m.Post(n + 1) // dropped
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
