package leadership

import (
	"slices"
	"testing"
	"testing/synctest"
	"time"
)

// advanceTo moves the calling synctest bubble's clock to at, and returns at: the tests that
// reckon with the heartbeat timeout run in bubbles, where its windows pass exactly and take no
// time, and name the instants they look at.
func advanceTo(at time.Time) time.Time {
	time.Sleep(time.Until(at))
	return at
}

// The view's rules: leading needs an assignment, no fence, and a heartbeat acknowledged within the
// timeout; a fence holds until every partition is revoked and a fresh assignment comes.
func TestLeadsOnlyWhileAssignedUnfencedAndHeard(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 100 * time.Millisecond
		v := newView(timeout)
		if holds, leading := v.Read(); holds || leading {
			t.Fatalf("an empty view holds %v, leads %v", holds, leading)
		}
		acquired := time.Now()
		if !v.acquire([]int32{3, 1}) {
			t.Fatal("the first assignment does not begin leadership")
		}
		if v.acquire([]int32{2, 3}) {
			t.Fatal("a second assignment begins leadership again")
		}
		if got := v.Partitions(); !slices.Equal(got, []int32{1, 2, 3}) {
			t.Fatalf("leads %v, want [1 2 3]", got)
		}
		// Heard: a heartbeat sent now and acknowledged keeps it leading past the first timeout.
		heard := advanceTo(acquired.Add(timeout / 2))
		v.acknowledged(heard)
		advanceTo(heard.Add(timeout * 3 / 4))
		if !v.Leading() {
			t.Fatal("not leading within the timeout of an acknowledged heartbeat")
		}
		if _, silent := v.fenceIfSilent(); silent {
			t.Fatal("fenced within the timeout of an acknowledged heartbeat")
		}
		// Silent: it reads as fenced once the timeout passes, before fenceIfSilent.
		advanceTo(heard.Add(timeout * 7 / 4))
		if v.Leading() || !v.Fenced() || v.Partitions() != nil {
			t.Fatal("a silent leader still reads as leading")
		}
		led, silent := v.fenceIfSilent()
		if !silent || !slices.Equal(led, []int32{1, 2, 3}) {
			t.Fatalf("fenceIfSilent = %v, %v", led, silent)
		}
		// Fenced, an acknowledgement restores nothing, nor does an assignment while any is held.
		v.acknowledged(time.Now())
		v.acquire([]int32{4})
		if v.Leading() {
			t.Fatal("a fenced contender leads again without every partition revoked first")
		}
		lost, wasFenced := v.revoke([]int32{1, 9})
		if !slices.Equal(lost, []int32{1}) || !wasFenced {
			t.Fatalf("revoke = %v, %v; want [1], true", lost, wasFenced)
		}
		if lost, _ := v.revoke(v.Held()); !slices.Equal(lost, []int32{2, 3, 4}) {
			t.Fatalf("revoke(Held()) = %v", lost)
		}
		// A fresh assignment after every revoke lifts the fence and counts as a heartbeat now.
		if !v.acquire([]int32{0}) || !v.Leading() {
			t.Fatal("a fresh assignment after the revokes does not lead")
		}
	})
}

// Heartbeats go to up to HeartbeatFanout partitions a round, every one in turn.
func TestNextBeatsTakesThePartitionsInTurn(t *testing.T) {
	v := newView(time.Second)
	if beats := v.nextBeats(); beats != nil {
		t.Fatalf("beats %v with nothing assigned", beats)
	}
	v.acquire([]int32{0, 1, 2, 3, 4})
	seen := map[int32]int{}
	for range 5 {
		beats := v.nextBeats()
		if len(beats) != HeartbeatFanout {
			t.Fatalf("a round of %v, want %d partitions", beats, HeartbeatFanout)
		}
		for _, p := range beats {
			seen[p]++
		}
	}
	for p := range int32(5) {
		if seen[p] != HeartbeatFanout {
			t.Errorf("partition %d had %d heartbeats in 5 rounds, want %d", p, seen[p], HeartbeatFanout)
		}
	}
	v.revoke([]int32{1, 2, 3, 4})
	if beats := v.nextBeats(); !slices.Equal(beats, []int32{0}) {
		t.Fatalf("one partition left: beats %v", beats)
	}
}

func TestList(t *testing.T) {
	if got := List([]int32{0, 3, 5}); got != "0,3,5" {
		t.Errorf("List = %q", got)
	}
	if a, b := NewTenure(), NewTenure(); a == b || len(a) != 16 {
		t.Errorf("tenures %q and %q", a, b)
	}
}
