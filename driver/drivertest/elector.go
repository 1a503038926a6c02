package drivertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
)

// Election is one leader election under test, which nothing else contends in.
type Election struct {
	// Join adds a contender to the election, before its first Pulse; lost is its barrier, which
	// the elector calls within Pulse with the partitions it lost. The suite closes it.
	Join func(t *testing.T, lost func(partitions []int32)) driver.Elector
	// Partitions is how many partitions (shards) the election has; 1 if zero.
	Partitions int
	// PulseEvery is how often each contender's Pulse is called, as the engine paces it; 10ms if
	// zero.
	PulseEvery time.Duration
	// Within bounds how long electing a leader, or handing over to the next, may take; a minute
	// if zero.
	Within time.Duration
	// PulseSteadily pulses every PulseEvery even an elector that can rest, as the engine does
	// while its shards' epochs start and end; otherwise such an elector rests as it asks.
	PulseSteadily bool
}

func (e Election) withDefaults() Election {
	if e.Partitions == 0 {
		e.Partitions = 1
	}
	if e.PulseEvery == 0 {
		e.PulseEvery = 10 * time.Millisecond
	}
	if e.Within == 0 {
		e.Within = time.Minute
	}
	return e
}

// RunElector runs the elector contract, each rule in a subtest on an election of its own from
// open. Each is one the engine relies on (see driver.Elector): an epoch publishes a shard only
// while its harvester leads it, and only one harvester may.
func RunElector(t *testing.T, open func(t *testing.T) Election) {
	for _, c := range []struct {
		name string
		test func(t *testing.T, e Election)
	}{
		{"ALoneContenderLeadsEveryPartition", aLoneContenderLeadsEveryPartition},
		{"OneLeaderPerPartition", oneLeaderPerPartition},
		{"CloseHandsOver", closeHandsOver},
	} {
		t.Run(c.name, func(t *testing.T) { c.test(t, open(t).withDefaults()) })
	}
}

// contender is an elector that the suite pulses from a loop of its own, as the engine does: every
// PulseEvery, or, for an elector that can rest (driver.RestingElector), when it asks to be, as the
// engine pulses one whose shards are at rest (unless Election.PulseSteadily).
type contender struct {
	driver.Elector
	name   string
	stop   chan struct{}
	done   chan struct{}
	mu     sync.Mutex
	err    error // Pulse's
	closed bool
}

func join(t *testing.T, e Election, name string) *contender {
	t.Helper()
	c := &contender{name: name, stop: make(chan struct{}), done: make(chan struct{})}
	c.Elector = e.Join(t, func([]int32) {})
	resting, _ := c.Elector.(driver.RestingElector)
	if e.PulseSteadily {
		resting = nil
	}
	var wake <-chan struct{}
	if resting != nil {
		wake = resting.Wake()
	}
	go func() {
		defer close(c.done)
		timer := time.NewTimer(e.PulseEvery)
		defer timer.Stop()
		for {
			began := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), e.Within)
			_, err := c.Pulse(ctx)
			cancel()
			if err != nil {
				c.mu.Lock()
				c.err = err
				c.mu.Unlock()
				return
			}
			next := began.Add(e.PulseEvery)
			if resting != nil {
				// As the engine: a rest counts from when the elector says it.
				if after := time.Now().Add(resting.Rest()); after.After(next) {
					next = after
				}
			}
			timer.Reset(time.Until(next))
			select {
			case <-c.stop:
				return
			case <-wake:
			case <-timer.C:
			}
		}
	}()
	t.Cleanup(func() { c.close(t) })
	return c
}

// close stops the contender's pulses, then closes it; again, it does nothing.
func (c *contender) close(t *testing.T) {
	t.Helper()
	if c.closed {
		return
	}
	c.closed = true
	close(c.stop)
	<-c.done
	c.mu.Lock()
	err := c.err
	c.mu.Unlock()
	if err != nil {
		t.Errorf("%s: Pulse: %v", c.name, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Close(ctx); err != nil {
		t.Errorf("%s: Close: %v", c.name, err)
	}
}

// led returns the partitions the contender leads, checking that it has none unless it leads:
// read between two calls of Leading that both say it does not lead, they must be empty.
func (c *contender) led(t *testing.T) []int32 {
	t.Helper()
	before := c.Leading()
	parts := c.Partitions()
	after := c.Leading()
	if !before && !after && len(parts) > 0 {
		t.Errorf("%s: Partitions %v while not leading", c.name, parts)
	}
	if before && after && len(parts) == 0 {
		t.Errorf("%s: no partitions while leading", c.name)
	}
	return parts
}

// await waits until cond holds, failing the test after e.Within.
func await(t *testing.T, e Election, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(e.Within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", e.Within, what)
		}
		time.Sleep(e.PulseEvery)
	}
}

func allPartitions(e Election) []int32 {
	var all []int32
	for p := range e.Partitions {
		all = append(all, int32(p))
	}
	return all
}

// leaders returns which contender leads each partition, reading each contender twice around the
// others: a partition counts as led by two contenders only if one led it at both of its reads
// and another in between, that is, both at once.
func leaders(t *testing.T, cs []*contender) map[int32]*contender {
	t.Helper()
	first := make([][]int32, len(cs))
	for i, c := range cs {
		first[i] = c.led(t)
	}
	byPartition := map[int32]*contender{}
	for i, c := range cs {
		again := c.led(t)
		for _, p := range again {
			if other, ok := byPartition[p]; ok && slices.Contains(first[i], p) {
				t.Errorf("partition %d led by %s and %s at once", p, other.name, c.name)
			}
			byPartition[p] = c
		}
	}
	return byPartition
}

// A contender alone in its election comes to lead every partition, without fencing itself, and
// Partitions says so while Leading does.
func aLoneContenderLeadsEveryPartition(t *testing.T, e Election) {
	c := join(t, e, "alone")
	await(t, e, "the lone contender leads every partition", func() bool {
		return c.Leading() && slices.Equal(sorted(c.led(t)), allPartitions(e))
	})
	if c.Fenced() {
		t.Error("a leader says it is fenced")
	}
}

func sorted(s []int32) []int32 {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// Among several contenders, every partition comes to be led, and never by two at once.
func oneLeaderPerPartition(t *testing.T, e Election) {
	var cs []*contender
	for i := range 3 {
		cs = append(cs, join(t, e, fmt.Sprintf("c%d", i)))
	}
	await(t, e, "every partition led", func() bool { return len(leaders(t, cs)) == e.Partitions })
	// A steady stretch, read again and again: each read must find no partition led twice.
	for range 50 {
		leaders(t, cs)
		time.Sleep(e.PulseEvery)
	}
}

// When the leader closes, it no longer leads, a Pulse after Close does not make it lead, and
// another contender takes over every partition.
func closeHandsOver(t *testing.T, e Election) {
	cs := []*contender{join(t, e, "first"), join(t, e, "second")}
	await(t, e, "every partition led", func() bool { return len(leaders(t, cs)) == e.Partitions })
	// Close a contender that leads (with several partitions, each may lead some).
	var leader, other *contender
	for _, c := range leaders(t, cs) {
		leader = c
	}
	for _, c := range cs {
		if c != leader {
			other = c
		}
	}
	leader.close(t)
	if leader.Leading() || len(leader.Partitions()) > 0 {
		t.Errorf("%s leads %v after Close", leader.name, leader.Partitions())
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.Within)
	defer cancel()
	if leading, err := leader.Pulse(ctx); leading || (err == nil && leader.Leading()) {
		t.Errorf("Pulse after Close = %v, %v; leading %v", leading, err, leader.Leading())
	} else if err != nil && errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Pulse after Close waited out its context: %v", err)
	}
	await(t, e, "the other contender leads every partition", func() bool {
		return slices.Equal(sorted(other.led(t)), allPartitions(e))
	})
}
