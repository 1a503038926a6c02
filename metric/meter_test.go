package metric

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestMeterReadsOncePerInterval(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	m := newMeter("throughput", time.Second, clock.now)
	m.Add(5)
	if _, ok := m.Read(); ok {
		t.Fatal("read before the interval passed")
	}
	clock.t = clock.t.Add(2 * time.Second)
	s, ok := m.Read()
	if !ok || s.Total != 5 || s.IntervalTotal != 5 || s.Rate != 2.5 || s.IntervalRate != 2.5 || s.Elapsed != 2*time.Second {
		t.Fatalf("first reading %+v, %v", s, ok)
	}
	m.Add(10)
	clock.t = clock.t.Add(time.Second)
	s, ok = m.Read()
	if !ok || s.Total != 15 || s.IntervalTotal != 10 || s.IntervalRate != 10 || s.Rate != 5 {
		t.Fatalf("second reading %+v, %v", s, ok)
	}
	if _, ok := m.Read(); ok {
		t.Fatal("read twice in one instant")
	}
}

func TestMeterIsSafeForConcurrentUse(t *testing.T) {
	// A clock a nanosecond on at each look: every Read is past the interval, the last one too.
	var ticks atomic.Int64
	m := newMeter("x", time.Nanosecond, func() time.Time { return time.Unix(0, ticks.Add(1)) })
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				m.Add(1)
				m.Read()
			}
		})
	}
	wg.Wait()
	s, ok := m.Read()
	if !ok || s.Total != 8000 {
		t.Fatalf("total %d, want 8000", s.Total)
	}
}
