package int

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// A leader frozen (SIGSTOP) for longer than the session timeout loses leadership to another
// reaper; when it resumes (SIGCONT) it must not publish anything that breaks per-key order.
func TestSplitBrainFrozenLeaderResumes(t *testing.T) {
	splitBrain(t, "split brain", rigOptions{}, pick(3, 10))
}

func splitBrain(t *testing.T, scenario string, o rigOptions, rounds int) {
	// With a long linger, a freeze almost always catches messages still queued in the producer:
	// the case that could publish stale records when the process resumes.
	o.extraYAML += "  producerKafkaConfig:\n    linger.ms: 100"
	r := newRig(t, o)
	r.startWriters(4, 1000, 3000)
	reapers := []*reaper{r.startReaper("a"), r.startReaper("b")}
	var takeovers []time.Duration
	for round := range rounds {
		waitLeader(t, 30*time.Second, reapers...)
		time.Sleep(time.Second) // let the group settle, so the takeover measured is the freeze's
		leader := waitLeader(t, 30*time.Second, reapers...)
		r.waitProgress(1000, time.Minute)
		var other *reaper
		for _, p := range reapers {
			if p != leader {
				other = p
			}
		}
		leader.signal(syscall.SIGSTOP)
		frozen := time.Now()
		// Every 5ms: the takeover time measured is a chaos figure.
		if !testwait.UntilEvery(30*time.Second, 5*time.Millisecond, other.isLeading) {
			t.Fatalf("round %d: %s did not take over from the frozen %s", round, other.name, leader.name)
		}
		takeovers = append(takeovers, time.Since(frozen))
		t.Logf("round %d: %s frozen; %s took over after %v", round, leader.name, other.name, takeovers[round].Round(time.Millisecond))
		// The successor publishes while the old leader is frozen. The window is generous: this checks
		// progress, not speed, on a machine that may be busy with other test processes.
		r.waitProgress(1000, time.Minute)
		leader.signal(syscall.SIGCONT)
		time.Sleep(2 * time.Second) // the resumed process gets every chance to publish stale records
	}
	report := r.finish(2 * time.Minute)
	figure(t, scenario, "leaders frozen past the session timeout and resumed %d times (linger.ms 100); successor elected after p50 %v max %v; records %d, duplicates %d, lost %d, reversals %d",
		rounds, median(takeovers), slices.Max(takeovers).Round(time.Millisecond), report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}
