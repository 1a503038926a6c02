// Package metric measures throughput.
package metric

import (
	"fmt"
	"sync"
	"time"
)

// MeterStats is one reading of a Meter.
type MeterStats struct {
	Name string
	// Elapsed is the time since the meter was created.
	Elapsed time.Duration
	// Total counts everything added since the meter was created.
	Total int64
	// Rate is Total per second over Elapsed.
	Rate float64
	// IntervalTotal counts what was added since the previous reading.
	IntervalTotal int64
	// IntervalRate is IntervalTotal per second over the time since the previous reading.
	IntervalRate float64
}

func (s MeterStats) String() string {
	return fmt.Sprintf("%s: total %d (%.1f/s), last %d (%.1f/s)", s.Name, s.Total, s.Rate, s.IntervalTotal, s.IntervalRate)
}

// Meter counts events and reports their rate at most once per interval. It is safe for
// concurrent use.
type Meter struct {
	name     string
	interval time.Duration
	now      func() time.Time

	mu        sync.Mutex
	start     time.Time
	total     int64
	lastRead  time.Time
	lastTotal int64
}

// NewMeter returns a Meter that reports at most once per interval.
func NewMeter(name string, interval time.Duration) *Meter {
	return newMeter(name, interval, time.Now)
}

func newMeter(name string, interval time.Duration, now func() time.Time) *Meter {
	t := now()
	return &Meter{name: name, interval: interval, now: now, start: t, lastRead: t}
}

// Add counts n events.
func (m *Meter) Add(n int64) {
	m.mu.Lock()
	m.total += n
	m.mu.Unlock()
}

// Read returns a reading, and starts a new interval, if an interval has passed since the last
// reading; otherwise it returns false.
func (m *Meter) Read() (MeterStats, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	sinceLast := now.Sub(m.lastRead)
	if sinceLast < m.interval {
		return MeterStats{}, false
	}
	elapsed := now.Sub(m.start)
	stats := MeterStats{
		Name:          m.name,
		Elapsed:       elapsed,
		Total:         m.total,
		Rate:          perSecond(m.total, elapsed),
		IntervalTotal: m.total - m.lastTotal,
		IntervalRate:  perSecond(m.total-m.lastTotal, sinceLast),
	}
	m.lastRead, m.lastTotal = now, m.total
	return stats, true
}

func perSecond(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}
