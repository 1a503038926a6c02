package int

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"
)

// Three reapers on one outbox; the leader is killed (SIGKILL) and stopped (SIGTERM) in turn,
// and a fresh reaper started in its place each time. Each takeover is measured from the
// leader's loss to the first record published after its successor took over.
func TestFailover(t *testing.T) {
	r := newRig(t, rigOptions{})
	r.startWriters(4, 1000, 2000)
	reapers := []*reaper{r.startReaper("r0"), r.startReaper("r1"), r.startReaper("r2")}
	var killed, stopped []time.Duration
	for round := range pick(4, 12) {
		waitLeader(t, 30*time.Second, reapers...)
		r.waitProgress(500, 30*time.Second)
		leader := waitLeader(t, 30*time.Second, reapers...)
		sig, how := syscall.SIGKILL, "killed"
		if round%2 == 1 {
			sig, how = syscall.SIGTERM, "stopped"
		}
		lost := time.Now()
		leader.signal(sig)
		code := leader.waitExit(t, 30*time.Second)
		if sig == syscall.SIGTERM && code != 0 {
			t.Fatalf("round %d: %s exited %d after SIGTERM", round, leader.name, code)
		}
		reapers = slices.DeleteFunc(reapers, func(p *reaper) bool { return p == leader })
		successor := waitLeader(t, 30*time.Second, reapers...)
		acquired := successor.lastAcquired()
		var first time.Time
		deadline := time.Now().Add(30 * time.Second)
		for first.IsZero() && time.Now().Before(deadline) {
			first = r.v.FirstArrivalAfter(acquired)
			time.Sleep(5 * time.Millisecond)
		}
		if first.IsZero() {
			t.Fatalf("round %d: nothing published after %s took over", round, successor.name)
		}
		takeover := first.Sub(lost)
		if sig == syscall.SIGKILL {
			killed = append(killed, takeover)
		} else {
			stopped = append(stopped, takeover)
		}
		t.Logf("round %d: %s %s; %s publishing after %v", round, leader.name, how, successor.name, takeover.Round(time.Millisecond))
		reapers = append(reapers, r.startReaper(fmt.Sprintf("r%d", round+3)))
	}
	report := r.finish(2 * time.Minute)
	figure(t, "failover", "leaders lost %d (%d SIGKILL, %d SIGTERM); takeover after SIGKILL p50 %v max %v; after SIGTERM p50 %v max %v; records %d, duplicates %d, lost %d, reversals %d",
		len(killed)+len(stopped), len(killed), len(stopped), median(killed), slices.Max(killed).Round(time.Millisecond),
		median(stopped), slices.Max(stopped).Round(time.Millisecond),
		report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}
