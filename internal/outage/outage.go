// Package outage logs an outage once when it begins, again every so often while it lasts, and
// once when it ends, however many operations fail in between, so that a dependency that is down
// neither floods the log nor goes unmentioned; and it tells whether an outage is going on.
// goharvest follows its database and Kafka with it, package neli its Kafka clients.
package outage

import (
	"cmp"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// LogInterval is how often an outage that persists is logged again, with its count of failures
// and its latest error, so that a log read at any time shows it is still going on.
const LogInterval = 30 * time.Second

// FlapWindow is how far back Err looks for failures that keep coming back: an operation that
// succeeds between failures (say, a harvester's pre-epoch checks succeed and its marks then fail)
// ends its outage each time and starts another, and gets nothing done all the while.
const FlapWindow = 10 * time.Second

// Counter counts failures (a prometheus.Counter is one).
type Counter interface{ Inc() }

// Logger follows the outages of one dependency. Set its fields before first use; its methods
// may then be called from any goroutine.
type Logger struct {
	What      string        // the dependency, as the log names it: "database"
	Meanwhile string        // what goes on during an outage; default "retrying"
	Failures  Counter       // counts every failure; may be nil
	Repeat    time.Duration // how often a persisting outage is logged again; zero: only when it begins and ends
	// Quiet is how long after its last failure a flapping outage (see FlapWindow) still counts
	// for Err: longer than a retry's backoff.
	Quiet time.Duration

	mu       sync.Mutex
	failing  bool
	since    time.Time
	logged   time.Time // when the outage was last logged
	count    int
	lastOp   string
	lastErr  error
	failedAt []time.Time // the failures of the last FlapWindow, outages or not
}

// Fail records that op failed with err. It logs a warning when this begins an outage, and again
// when the outage has lasted Repeat since it was last logged; attrs are added to the log.
func (l *Logger) Fail(log *slog.Logger, op string, err error, attrs ...any) {
	if l.Failures != nil {
		l.Failures.Inc()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.count++
	l.lastOp, l.lastErr = op, err
	now := time.Now()
	l.failedAt = append(l.recentFailures(now), now)
	meanwhile := cmp.Or(l.Meanwhile, "retrying")
	switch {
	case !l.failing:
		l.failing, l.since, l.logged = true, now, now
		log.Warn(l.What+" unavailable; "+meanwhile, append([]any{"op", op, "error", err}, attrs...)...)
	case l.Repeat > 0 && now.Sub(l.logged) >= l.Repeat:
		l.logged = now
		log.Warn(l.What+" still unavailable; "+meanwhile, append([]any{"for", now.Sub(l.since).Round(time.Second),
			"failures", l.count, "op", op, "error", err}, attrs...)...)
	}
}

// OK records a success, which ends the outage going on, if any, and logs that it ended.
func (l *Logger) OK(log *slog.Logger) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failing {
		log.Info(l.What+" available again", "after", time.Since(l.since).Round(time.Millisecond), "failures", l.count)
		l.failing, l.count = false, 0
	}
}

// recentFailures returns the failures of the last FlapWindow (l.mu held).
func (l *Logger) recentFailures(now time.Time) []time.Time {
	i := 0
	for i < len(l.failedAt) && now.Sub(l.failedAt[i]) > FlapWindow {
		i++
	}
	return l.failedAt[i:]
}

// Err describes the outage going on, or returns nil when there is none. One failure, retried at
// once, is not yet an outage; two in a row are, and so are failures that keep coming back
// between successes (three within FlapWindow, the last within Quiet).
func (l *Logger) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	recent := l.recentFailures(now)
	switch {
	case l.failing && l.count >= 2:
		return fmt.Errorf("%s unavailable for %v (%d failures; last: %s: %w)",
			l.What, now.Sub(l.since).Round(time.Millisecond), l.count, l.lastOp, l.lastErr)
	case len(recent) >= 3 && now.Sub(recent[len(recent)-1]) < l.Quiet:
		return fmt.Errorf("%s failing again and again (%d failures in the last %v; last: %s: %w)",
			l.What, len(recent), FlapWindow, l.lastOp, l.lastErr)
	}
	return nil
}
