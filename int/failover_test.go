package int

import (
	"fmt"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// Three reapers on one outbox; the leader is killed (SIGKILL) and stopped (SIGTERM) in turn,
// and a fresh reaper started in its place each time. Each takeover is measured from the
// leader's loss to the first record published after its successor took over.
func TestFailover(t *testing.T) {
	failover(t, "failover", rigOptions{}, 1000, pick(4, 12))
}

// Failover again, with writers on only 10 keys and runs of up to 100 records per key per
// transaction: a leader killed after its runs committed and before their purge leaves them to
// its successor, which must purge what the note lists rather than publish the runs again.
func TestFailoverKeyRuns(t *testing.T) {
	failover(t, "failover, key runs", rigOptions{extraYAML: "    maxKeyRun: 100", readCommitted: true, slowPurge: true}, 10, pick(4, 12))
}

// Failover as a user of a default setup sees it: Kafka's own group timings (sessions of at least
// 6s, the first rebalance of a group held 3s) and goharvest's default heartbeat timeout (5s, so
// 10s sessions), where the other scenarios run 1s timeouts on a broker that allows them.
func TestFailoverWithDefaults(t *testing.T) {
	failover(t, "failover, default timings", rigOptions{kafka: defaultKafka, heartbeatTimeout: 5 * time.Second}, 1000, pick(2, 6))
}

func failover(t *testing.T, scenario string, o rigOptions, keys, rounds int) {
	r := newRig(t, o)
	r.startWriters(4, keys, 2000)
	reapers := []*reaper{r.startReaper("r0"), r.startReaper("r1"), r.startReaper("r2")}
	all := slices.Clone(reapers)
	var killed, stopped []time.Duration
	for round := range rounds {
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
		testwait.Until(30*time.Second, func() bool { first = r.v.FirstArrivalAfter(acquired); return !first.IsZero() })
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
		fresh := r.startReaper(fmt.Sprintf("r%d", round+3))
		reapers = append(reapers, fresh)
		all = append(all, fresh)
	}
	report := r.finish(2 * time.Minute)
	noted := 0
	for _, p := range all {
		p.mu.Lock()
		noted += p.notedPurges
		p.mu.Unlock()
	}
	figure(t, scenario, "leaders lost %d (%d SIGKILL, %d SIGTERM); takeover after SIGKILL p50 %v max %v; after SIGTERM p50 %v max %v; successors that purged noted records %d; records %d, duplicates %d, lost %d, reversals %d",
		len(killed)+len(stopped), len(killed), len(stopped), median(killed), slices.Max(killed).Round(time.Millisecond),
		median(stopped), slices.Max(stopped).Round(time.Millisecond), noted,
		report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2].Round(time.Millisecond)
}
