package int

import (
	"fmt"
	"net/http"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// The leading reaper is cut off from every broker while Postgres stays reachable (a network
// partition between it and Kafka): it must fence itself and stop publishing before its standby,
// which still reaches Kafka, takes over; and when the partition heals it must publish nothing
// that breaks per-key order. The cut-off reaper reaches Kafka through the cluster's proxies,
// which stop passing bytes either way, as a partition does; the standby does not.
func TestLeaderCutOffFromKafka(t *testing.T) {
	r := newRig(t, rigOptions{extraYAML: "  producerKafkaConfig:\n    linger.ms: 100"})
	r.startWriters(4, 1000, 2000)
	var takeovers, fences []time.Duration
	rounds := pick(1, 3)
	var previous *reaper // the last round's standby, which leads until this round's reaper can
	for round := range rounds {
		cut := r.startReaperThrough("cut-" + string(rune('a'+round)))
		if previous != nil {
			previous.end(t, syscall.SIGTERM)
		}
		waitLeader(t, 30*time.Second, cut)
		joined := time.Now()
		standby := r.startReaper("standby-" + string(rune('a'+round)))
		time.Sleep(2 * time.Second) // the standby joins the group; the leader keeps leading
		if !cut.isLeading() {
			t.Fatalf("round %d: %s", round, whyStoppedLeading(cut, joined))
		}
		r.waitProgress(1000, time.Minute)

		if err := r.kafka.Partition(); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		// Every 5ms: the takeover time is a chaos figure.
		if !testwait.UntilEvery(time.Minute, 5*time.Millisecond, standby.isLeading) {
			t.Fatalf("round %d: the standby did not take over from the cut-off leader", round)
		}
		takeovers = append(takeovers, time.Since(t0))
		cut.mu.Lock()
		fencedAt := cut.fencedAt
		cut.mu.Unlock()
		if fencedAt.Before(t0) {
			t.Fatalf("round %d: the cut-off leader never said it fenced itself", round)
		}
		fences = append(fences, fencedAt.Sub(t0))
		t.Logf("round %d: %s cut off; fenced itself after %v; %s took over after %v", round, cut.name,
			fencedAt.Sub(t0).Round(time.Millisecond), standby.name, takeovers[round].Round(time.Millisecond))
		r.waitProgress(1000, time.Minute)

		if err := r.kafka.Heal(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * time.Second) // the healed reaper gets every chance to publish stale records
		r.waitProgress(500, time.Minute)
		cut.end(t, syscall.SIGTERM)
		previous = standby // it drains the outbox at the end
	}
	report := r.finish(2 * time.Minute)
	figure(t, "leader cut off from Kafka", "3 nodes; the leader partitioned from every broker (Postgres reachable) %d times (linger.ms 100); fenced itself after p50 %v; the standby took over after p50 %v max %v; records %d, duplicates %d, lost %d, reversals %d",
		rounds, median(fences), median(takeovers), slices.Max(takeovers).Round(time.Millisecond), report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// whyStoppedLeading says, from p's log, why it stopped leading after since, before anything was cut:
// a leader that fenced itself (no heartbeat acknowledged within the timeout) on a machine too busy
// to run its loop or Kafka's on time fails this test for a reason other than the group's.
func whyStoppedLeading(p *reaper, since time.Time) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.selfFenced {
		if f.After(since) {
			return fmt.Sprintf("%s fenced itself at %s, %v after the standby started and before anything was cut: "+
				"no heartbeat of its own was acknowledged within the heartbeat timeout, with Kafka reachable; "+
				"the machine is likely too loaded to run the election on time (see %s's log)",
				p.name, f.Format("15:04:05.000"), f.Sub(since).Round(time.Millisecond), p.name)
		}
	}
	for _, e := range p.history {
		if !e.acquired && e.at.After(since) {
			return fmt.Sprintf("%s lost shard %d at %s, %v after the standby started: the group took it when the standby joined",
				p.name, e.shard, e.at.Format("15:04:05.000"), e.at.Sub(since).Round(time.Millisecond))
		}
	}
	return fmt.Sprintf("%s stopped leading after the standby started, and its log says neither that it fenced itself nor that it lost a shard", p.name)
}

// A leader cut off from every broker (Postgres reachable) is stopped as Kubernetes stops a pod,
// with SIGTERM: once at once, while it still counts itself leader with records in flight, and once
// after it has fenced itself, when its /readyz must answer within its 3s bound first. Though it can
// reach no broker to commit, abort, leave its group or close its producer, it exits 0 within what
// docs/operations.md promises for a clean stop: maxPollInterval + 2 × heartbeatTimeout. Its
// standby, which reaches Kafka, takes over, and every record arrives in order.
func TestReaperStopsWhileCutOffFromKafka(t *testing.T) {
	const heartbeatTimeout = time.Second // the rig's; maxPollInterval is half of it
	const promised = heartbeatTimeout/2 + 2*heartbeatTimeout
	// admin is a top-level key: /readyz on a port of its own.
	r := newRig(t, rigOptions{extraYAML: "admin:\n  address: 127.0.0.1:0"})
	r.startWriters(4, 1000, 2000)
	var previous *reaper
	for _, afterFence := range []bool{false, true} {
		name := fmt.Sprintf("cut-afterFence=%v", afterFence)
		cut := r.startReaperThrough(name)
		if previous != nil {
			previous.end(t, syscall.SIGTERM)
		}
		waitLeader(t, 30*time.Second, cut)
		standby := r.startReaper("standby-" + name)
		r.waitProgress(1000, time.Minute)

		if err := r.kafka.Partition(); err != nil {
			t.Fatal(err)
		}
		cutAt := time.Now()
		if afterFence {
			testwait.For(t, 30*time.Second, name+" to fence itself", func() bool {
				cut.mu.Lock()
				defer cut.mu.Unlock()
				return cut.fencedAt.After(cutAt)
			})
			// Fenced, it leads nothing; its readiness still asks Kafka, which does not answer.
			if code := cut.askReady(t); code != http.StatusServiceUnavailable {
				t.Errorf("%s: /readyz answered %d while cut off from Kafka; want 503", name, code)
			}
		}

		stopped := time.Now()
		cut.signal(syscall.SIGTERM)
		code := cut.waitExit(t, time.Minute)
		took := time.Since(stopped)
		t.Logf("%s: exited %d %v after SIGTERM, cut off from Kafka", name, code, took.Round(time.Millisecond))
		if code != 0 {
			t.Errorf("%s exited %d after SIGTERM while cut off from Kafka", name, code)
		}
		if took > promised+time.Second {
			t.Errorf("%s took %v to stop while cut off from Kafka; a clean stop takes at most maxPollInterval + 2 × heartbeatTimeout, %v", name, took, promised)
		}
		if !testwait.UntilEvery(time.Minute, 5*time.Millisecond, standby.isLeading) {
			t.Fatalf("%s: the standby did not take over", name)
		}
		r.waitProgress(1000, time.Minute)
		if err := r.kafka.Heal(); err != nil {
			t.Fatal(err)
		}
		previous = standby
	}
	r.finish(2 * time.Minute)
}
