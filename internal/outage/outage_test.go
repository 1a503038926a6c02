package outage

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
)

func TestMain(m *testing.M) { leakcheck.Main(m) }

func newLog() (*slog.Logger, *syncbuf.Buffer) {
	logs := &syncbuf.Buffer{}
	return slog.New(slog.NewTextHandler(logs, nil)), logs
}

// An outage that persists is logged when it starts, again every Repeat with its count of
// failures and its last error, and when it ends; a single failure does not make it an outage
// for Err.
func TestLogsPersistingOutageAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log, logs := newLog()
		l := &Logger{What: "database", Repeat: 50 * time.Millisecond}
		l.Fail(log, "mark", errors.New("first"))
		if err := l.Err(); err != nil {
			t.Errorf("one failure is already an outage: %v", err)
		}
		// Paced, as a retry's backoff would, so that Repeat elapses several times.
		pace := time.NewTicker(5 * time.Millisecond)
		defer pace.Stop()
		for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline); <-pace.C {
			l.Fail(log, "purge", errors.New("boom"))
		}
		out := logs.String()
		if n := strings.Count(out, "database unavailable; retrying"); n != 1 {
			t.Errorf("start logged %d times, want once:\n%s", n, out)
		}
		again := strings.Count(out, "database still unavailable; retrying")
		if again < 3 || again > 7 {
			t.Errorf("logged again %d times in 300ms at a 50ms interval, want about 5:\n%s", again, out)
		}
		if !strings.Contains(out, "failures=") || !strings.Contains(out, "error=boom") || !strings.Contains(out, "op=purge") {
			t.Errorf("the repeated lines lack the count or the last error:\n%s", out)
		}
		err := l.Err()
		if err == nil || !strings.Contains(err.Error(), "purge: boom") {
			t.Errorf("Err() = %v; want the last operation and error", err)
		}
		l.OK(log)
		if err := l.Err(); err != nil {
			t.Errorf("Err() after recovery = %v", err)
		}
		if !strings.Contains(logs.String(), "database available again") {
			t.Errorf("the recovery was not logged")
		}
	})
}

// Without Repeat, an outage is logged once however long it lasts, with what goes on meanwhile,
// and each failure is counted.
func TestLogsOnceWithoutRepeat(t *testing.T) {
	log, logs := newLog()
	var failures counter
	l := &Logger{What: "notifications", Meanwhile: "polling instead", Failures: &failures}
	for range 100 {
		l.Fail(log, "listen", errors.New("refused"))
	}
	out := logs.String()
	if n := strings.Count(out, "notifications unavailable; polling instead"); n != 1 || strings.Contains(out, "still unavailable") {
		t.Errorf("logged %d times (want once, never again):\n%s", n, out)
	}
	if failures != 100 {
		t.Errorf("counted %d failures, want 100", failures)
	}
	l.OK(log)
	l.OK(log)
	if n := strings.Count(logs.String(), "available again"); n != 1 {
		t.Errorf("the end logged %d times, want once", n)
	}
}

// Failures that keep coming back between successes are an outage for Err while the last is
// within Quiet, though each success ends the logged outage.
func TestFlappingIsAnOutage(t *testing.T) {
	log, _ := newLog()
	l := &Logger{What: "database", Quiet: time.Hour}
	for range 3 {
		l.Fail(log, "mark", errors.New("boom"))
		l.OK(log)
	}
	if err := l.Err(); err == nil || !strings.Contains(err.Error(), "failing again and again") {
		t.Errorf("Err() = %v; want the flapping described", err)
	}
	l = &Logger{What: "database"} // Quiet 0: a flap counts for no time at all
	for range 3 {
		l.Fail(log, "mark", errors.New("boom"))
		l.OK(log)
	}
	if err := l.Err(); err != nil {
		t.Errorf("Err() with no quiet time = %v", err)
	}
}

type counter int

func (c *counter) Inc() { *c++ }
