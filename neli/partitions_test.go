package neli

import (
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// led returns who leads each partition now.
func led(cs []*contender) map[int32]string {
	m := map[int32]string{}
	for _, c := range cs {
		for _, p := range c.n.Partitions() {
			m[p] = c.name
		}
	}
	return m
}

// waitForBalance waits until every one of the partitions is led and each contender leads
// between min and max of them, and returns who leads what.
func waitForBalance(t *testing.T, within time.Duration, partitions, lo, hi int, cs ...*contender) map[int32]string {
	t.Helper()
	var owners map[int32]string
	if !testwait.UntilEvery(within, 10*time.Millisecond, func() bool {
		owners = led(cs)
		counts := map[string]int{}
		for _, name := range owners {
			counts[name]++
		}
		balanced := len(owners) == partitions
		for _, c := range cs {
			balanced = balanced && counts[c.name] >= lo && counts[c.name] <= hi
		}
		return balanced
	}) {
		t.Fatalf("partitions not spread over %d contenders within %v: %v", len(cs), within, owners)
	}
	return owners
}

func moved(before, after map[int32]string) int {
	n := 0
	for p, owner := range after {
		if before[p] != owner {
			n++
		}
	}
	return n
}

// Three contenders share eight partitions two or three each; a fourth joining takes two, and a
// contender leaving hands over only its own. A partition changes hands only after its old owner's
// barrier has returned.
func TestPartitionsSpreadEvenlyAndMoveLittle(t *testing.T) {
	addr, group := kafkacluster.Shared(t).Addr(), newGroup("spread")
	const partitions = 8
	type interval struct {
		who        string
		start, end time.Time
	}
	var (
		mu       sync.Mutex
		barriers = map[int32][]interval{} // each partition's barriers: who ran them, and when
	)
	withBarrier := func(c *Config) {
		c.Partitions = partitions
		name := c.Name
		c.Barrier = func(ps []int32) {
			start := time.Now()
			// A barrier that takes a while: long enough that a new owner starting early would show.
			time.Sleep(200 * time.Millisecond)
			mu.Lock()
			for _, p := range ps {
				barriers[p] = append(barriers[p], interval{name, start, time.Now()})
			}
			mu.Unlock()
		}
	}
	cs := startContenders(t, addr, group, 3, withBarrier)
	s := startSampler(t, cs...)
	before := waitForBalance(t, 20*time.Second, partitions, 2, 3, cs...)
	t.Logf("3 contenders: %v", before)

	cs = append(cs, startContender(t, addr, group, "c3", withBarrier))
	s.mu.Lock()
	s.contenders = cs
	s.mu.Unlock()
	after := waitForBalance(t, 20*time.Second, partitions, 2, 2, cs...)
	if n := moved(before, after); n > 3 {
		t.Errorf("a fourth contender moved %d partitions, want at most 3 (2 is the fewest): %v -> %v", n, before, after)
	}
	t.Logf("4 contenders: %v", after)

	leaving := cs[0]
	leaving.stop(t)
	rest := cs[1:]
	s.mu.Lock()
	s.contenders = rest
	s.mu.Unlock()
	final := waitForBalance(t, 20*time.Second, partitions, 2, 3, rest...)
	for p, owner := range after {
		if owner != leaving.name && final[p] != owner {
			t.Errorf("partition %d moved from %s to %s although its owner stayed", p, owner, final[p])
		}
	}
	s.stop(t)

	// No contender acquires a partition while another is still in its barrier for it, and none
	// fences itself: nothing here keeps heartbeats from coming back.
	for _, c := range append(rest, leaving) {
		checkEventOrder(t, c)
		for _, te := range c.eventLog() {
			if _, fenced := te.ev.(SelfFenced); fenced {
				t.Errorf("%s fenced itself at %v without a fault", c.name, te.at.Format("15:04:05.000"))
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	for _, c := range cs {
		for _, te := range c.eventLog() {
			acq, ok := te.ev.(Acquired)
			if !ok {
				continue
			}
			for _, p := range acq.Partitions {
				for _, b := range barriers[p] {
					if b.who != c.name && !te.at.Before(b.start) && !te.at.After(b.end) {
						t.Errorf("%s acquired partition %d at %v, while %s was in its barrier for it (%v to %v)", c.name, p,
							te.at.Format("15:04:05.000"), b.who, b.start.Format("15:04:05.000"), b.end.Format("15:04:05.000"))
					}
				}
			}
		}
	}
}

func TestLeaderTopicGrowsToThePartitionsConfigured(t *testing.T) {
	b, group := kafkacluster.Shared(t), newGroup("grow")
	if err := b.CreateTopic(group+".leader", 1); err != nil {
		t.Fatal(err)
	}
	c := startContender(t, b.Addr(), group, "c0", func(c *Config) { c.Partitions = 4 })
	owners := waitForBalance(t, 20*time.Second, 4, 4, 4, c)
	if got := slices.Sorted(maps.Keys(owners)); !slices.Equal(got, []int32{0, 1, 2, 3}) {
		t.Fatalf("leads %v, want partitions 0-3", got)
	}
}

func TestMorePartitionsThanConfiguredIsAnError(t *testing.T) {
	b, group := kafkacluster.Shared(t), newGroup("shrink")
	if err := b.CreateTopic(group+".leader", 4); err != nil {
		t.Fatal(err)
	}
	n, err := New(Config{
		KafkaConfig:   map[string]any{"bootstrap.servers": b.Addr()},
		LeaderTopic:   group + ".leader",
		LeaderGroupID: group,
		Name:          "c0",
		Partitions:    2,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close(t.Context())
	_, err = n.Pulse(t.Context())
	if err == nil || !strings.Contains(err.Error(), "has 4 partitions, more than the 2 configured") {
		t.Fatalf("Pulse returned %v, want an error about the partition count", err)
	}
}

// A contender whose loop stalls past the session timeout fences itself off all its partitions;
// the others take them only after that; when it resumes it gives them up, rejoins, and the
// partitions are spread over all three again.
func TestStalledContenderFencesAllItsPartitionsAndRejoins(t *testing.T) {
	const partitions = 8
	cs := startContenders(t, kafkacluster.Shared(t).Addr(), newGroup("stallmany"), 3, func(c *Config) { c.Partitions = partitions })
	s := startSampler(t, cs...)
	before := waitForBalance(t, 20*time.Second, partitions, 2, 3, cs...)
	stalled := cs[0]
	var held []int32
	for p, owner := range before {
		if owner == stalled.name {
			held = append(held, p)
		}
	}
	stalled.paused.Store(true)
	stalledAt := time.Now()
	// The others take every partition, and none while the stalled one still counts itself leader
	// (the sampler checks that throughout).
	waitForBalance(t, 10*time.Second, partitions, 4, 4, cs[1:]...)
	t.Logf("%s stalled holding %v; the others lead all %d after %v", stalled.name, held, partitions, time.Since(stalledAt))
	if stalled.n.IsLeader() {
		t.Fatal("the stalled contender still counts itself leader")
	}
	stalled.paused.Store(false)
	after := waitForBalance(t, 20*time.Second, partitions, 2, 3, cs...)
	t.Logf("after it resumed: %v", after)
	s.stop(t)
	for _, c := range cs {
		checkEventOrder(t, c)
	}
}

// A contender started with more partitions than a running one grows the leader topic and joins.
// The balancer may give it the new partitions and leave the running one what it led, so that
// neither is assigned a partition beyond its count while the two split the keys differently; the
// running one finds the topic grown when the join's rebalance assigns it, and stops with an error
// that says why.
func TestContenderStopsWhenAnotherGrowsTheTopic(t *testing.T) {
	b, group := kafkacluster.Shared(t), newGroup("grown")
	fewer := startContender(t, b.Addr(), group, "fewer", func(c *Config) { c.Partitions = 2 })
	waitForBalance(t, 20*time.Second, 2, 2, 2, fewer)
	startContender(t, b.Addr(), group, "more", func(c *Config) { c.Partitions = 4 })
	select {
	case err := <-fewer.done:
		fewer.cancel()
		fewer.cancel = nil
		if err == nil || !strings.Contains(err.Error(), "different number of partitions") {
			t.Fatalf("the contender with 2 partitions stopped with %v; want the error naming a different number of partitions", err)
		}
		if err := fewer.n.Close(t.Context()); err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the contender with 2 partitions still ran 30s after one with 4 joined, leading %v: it did not notice the grown topic",
			fewer.n.Partitions())
	}
}
