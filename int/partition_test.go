package int

import (
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testwait"
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
		standby := r.startReaper("standby-" + string(rune('a'+round)))
		time.Sleep(2 * time.Second) // the standby joins the group; the leader keeps leading
		if !cut.isLeading() {
			t.Fatalf("round %d: %s stopped leading when the standby joined", round, cut.name)
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
