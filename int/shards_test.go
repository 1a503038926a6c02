package int

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// The sharded scenarios: 3 reapers publish 8 shards, 2 or 3 each, while writers load 1000 keys
// (so every shard has work), and a fault moves shards. A shard's takeover is the time from the
// fault to the "leader acquired" of the reaper that publishes it next, as that reaper's log
// times it.

const shardCount = 8

// shardRig starts a sharded rig with writers and three reapers, and waits for the shards to be
// spread over them.
func shardRig(t *testing.T, o rigOptions) (*rig, []*reaper) {
	t.Helper()
	o.shards = shardCount
	r := newRig(t, o)
	r.startWriters(4, 1000, 2000)
	reapers := []*reaper{r.startReaper("r0"), r.startReaper("r1"), r.startReaper("r2")}
	r.waitSpread(30*time.Second, 2, 3, reapers...)
	r.waitProgress(1000, 30*time.Second)
	return r, reapers
}

// owners returns the reapers among ps whose logs say they publish each shard now.
func owners(ps []*reaper) map[int][]*reaper {
	out := map[int][]*reaper{}
	for _, p := range ps {
		for _, shard := range p.shards() {
			out[shard] = append(out[shard], p)
		}
	}
	return out
}

// waitSpread waits until each shard is published by exactly one of ps and each of ps publishes
// lo to hi of them, and returns who publishes each.
func (r *rig) waitSpread(within time.Duration, lo, hi int, ps ...*reaper) map[int]*reaper {
	r.t.Helper()
	var spread map[int]*reaper
	settled := func() bool {
		byShard := owners(ps)
		spread = map[int]*reaper{}
		ok := len(byShard) == r.shards
		for shard, os := range byShard {
			ok = ok && len(os) == 1
			spread[shard] = os[0]
		}
		for _, p := range ps {
			n := len(p.shards())
			ok = ok && n >= lo && n <= hi
		}
		return ok
	}
	if !testwait.UntilEvery(within, 10*time.Millisecond, settled) {
		r.t.Fatalf("shards not spread %d to %d over %d reapers within %v: %s", lo, hi, len(ps), within, describe(ps))
	}
	return spread
}

// describe lists the shards each reaper publishes, for logs: "r0 [0 3 6], r1 [1 4]".
func describe(ps []*reaper) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("%s %v", p.name, p.shards()))
	}
	return strings.Join(parts, ", ")
}

// takeover is how long after a fault a shard's next publisher was assigned the shard and then
// acquired it (its epoch started).
type takeover struct{ assigned, acquired time.Duration }

// takeovers waits until each of shards has been acquired after t0 by one of ps, and returns
// how long after t0 each was.
func (r *rig) takeovers(t0 time.Time, shards []int, within time.Duration, ps ...*reaper) map[int]takeover {
	r.t.Helper()
	out := map[int]takeover{}
	allTaken := func() bool {
		for _, shard := range shards {
			if _, ok := out[shard]; ok {
				continue
			}
			for _, p := range ps {
				if at := p.acquiredAfter(shard, t0); !at.IsZero() {
					out[shard] = takeover{assigned: p.assignedAfter(shard, t0).Sub(t0), acquired: at.Sub(t0)}
					break
				}
			}
		}
		return len(out) == len(shards)
	}
	if !testwait.UntilEvery(within, 10*time.Millisecond, allTaken) {
		r.t.Fatalf("shards %v not taken over within %v (taken: %v): %s", shards, within, out, describe(ps))
	}
	return out
}

// acquired appends the takeovers' times to acquisition to ds.
func acquired(ds []time.Duration, ts map[int]takeover) []time.Duration {
	for _, t := range ts {
		ds = append(ds, t.acquired)
	}
	return ds
}

// moved lists the shards whose publisher differs between two spreads.
func moved(before, after map[int]*reaper) []int {
	var out []int
	for shard, p := range before {
		if after[shard] != p {
			out = append(out, shard)
		}
	}
	slices.Sort(out)
	return out
}

// takeoverLog writes per-shard takeovers for a round's log line: "shard 2 2.31s (assigned
// 2.2s), shard 5 2.4s (assigned 2.2s)".
func takeoverLog(ts map[int]takeover) string {
	var parts []string
	for _, shard := range slices.Sorted(maps.Keys(ts)) {
		parts = append(parts, fmt.Sprintf("shard %d %v (assigned %v)", shard, ts[shard].acquired.Round(time.Millisecond), ts[shard].assigned.Round(time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}

// spreadFigure is how a figure states the takeovers of a scenario: "12 shard takeovers, p50
// 2.3s max 2.6s".
func spreadFigure(ts []time.Duration) string {
	if len(ts) == 0 {
		return "no shard moved"
	}
	return fmt.Sprintf("%d shard takeovers, %s", len(ts), spread(ts))
}

// spread is "p50 2.3s max 2.6s".
func spread(ts []time.Duration) string {
	return fmt.Sprintf("p50 %v max %v", median(ts), slices.Max(ts).Round(time.Millisecond))
}

// The reaper publishing the most shards is killed (SIGKILL) and stopped (SIGTERM) in turn, and a
// fresh reaper started in its place each time. Its shards go to the two others; the shards they
// already published stay with them.
func TestShardsReaperLeaves(t *testing.T) {
	shardsReaperLeaves(t, "shards, reaper leaves", rigOptions{}, pick(2, 8))
}

func shardsReaperLeaves(t *testing.T, scenario string, o rigOptions, rounds int) {
	r, reapers := shardRig(t, o)
	var killed, stopped []time.Duration
	strays := 0 // shards that moved although their publisher stayed
	for round := range rounds {
		before := r.waitSpread(30*time.Second, 2, 3, reapers...)
		victim := slices.MaxFunc(reapers, func(a, b *reaper) int { return len(a.shards()) - len(b.shards()) })
		lost := victim.shards()
		sig, how := syscall.SIGKILL, "killed"
		if round%2 == 1 {
			sig, how = syscall.SIGTERM, "stopped"
		}
		t0 := time.Now()
		victim.end(t, sig)
		reapers = slices.DeleteFunc(reapers, func(p *reaper) bool { return p == victim })
		ts := r.takeovers(t0, lost, 30*time.Second, reapers...)
		after := r.waitSpread(30*time.Second, 4, 4, reapers...)
		for _, shard := range moved(before, after) {
			if before[shard] != victim {
				strays++
			}
		}
		if sig == syscall.SIGKILL {
			killed = acquired(killed, ts)
		} else {
			stopped = acquired(stopped, ts)
		}
		t.Logf("round %d: %s %s, its shards taken over: %s; now %s", round, victim.name, how, takeoverLog(ts), describe(reapers))
		r.waitProgress(1000, time.Minute)
		reapers = append(reapers, r.startReaper(fmt.Sprintf("r%d", round+3)))
	}
	r.waitSpread(30*time.Second, 2, 3, reapers...)
	report := r.finish(2 * time.Minute)
	r.checkLossesLogged(r.all...)
	figure(t, scenario, "3 reapers, 8 shards, %d rounds; after SIGKILL %s; after SIGTERM %s; shards moved whose publisher stayed %d; records %d, duplicates %d, lost %d, reversals %d",
		rounds, spreadFigure(killed), spreadFigure(stopped), strays,
		report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// A reaper is frozen (SIGSTOP) past the session timeout: the others take its shards while it
// cannot know. When it resumes (SIGCONT) it must fence itself, and nothing it had queued may
// break per-key order: the checker reads uncommitted records too, and a long linger makes a
// frozen producer almost always hold some.
func TestShardsReaperFrozen(t *testing.T) {
	r, reapers := shardRig(t, rigOptions{extraYAML: "  producerKafkaConfig:\n    linger.ms: 100"})
	var ts []time.Duration
	rounds := pick(1, 5)
	for round := range rounds {
		r.waitSpread(30*time.Second, 2, 3, reapers...)
		time.Sleep(500 * time.Millisecond) // let the group settle, so the takeover measured is the freeze's
		victim := reapers[round%len(reapers)]
		lost := victim.shards()
		others := slices.DeleteFunc(slices.Clone(reapers), func(p *reaper) bool { return p == victim })
		t0 := time.Now()
		victim.signal(syscall.SIGSTOP)
		taken := r.takeovers(t0, lost, 30*time.Second, others...)
		r.waitSpread(30*time.Second, 4, 4, others...)
		r.waitProgress(1000, time.Minute) // the others publish while it is frozen
		victim.signal(syscall.SIGCONT)
		// It says it lost each shard it had: its epochs end without publishing on.
		r.waitLost(victim, lost, t0, 30*time.Second)
		time.Sleep(2 * time.Second) // the resumed process gets every chance to publish stale records
		ts = acquired(ts, taken)
		t.Logf("round %d: %s frozen, its shards taken over: %s; resumed and fenced; now %s", round, victim.name, takeoverLog(taken), describe(reapers))
	}
	r.waitSpread(30*time.Second, 2, 3, reapers...)
	report := r.finish(2 * time.Minute)
	r.checkLossesLogged(r.all...)
	figure(t, "shards, reaper frozen", "3 reapers, 8 shards; a reaper frozen past the session timeout and resumed %d times (linger.ms 100); %s; records %d, duplicates %d, lost %d, reversals %d",
		rounds, spreadFigure(ts), report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// waitLost waits until p's log says it lost each of shards after t0.
func (r *rig) waitLost(p *reaper, shards []int, t0 time.Time, within time.Duration) {
	r.t.Helper()
	var missing []int
	allLost := func() bool {
		missing = slices.DeleteFunc(slices.Clone(shards), func(s int) bool { return !p.lostAfter(s, t0).IsZero() })
		return len(missing) == 0
	}
	if !testwait.UntilEvery(within, 10*time.Millisecond, allLost) {
		r.t.Fatalf("%s did not give up shards %v within %v of resuming", p.name, missing, within)
	}
}

// A fourth reaper joins under load: the shards spread 2 each, moving as few as they can. A moved
// shard's handover is measured from its old publisher's "leader revoked" to its new one's
// "leader acquired": the time no one publishes it. In the long variant a reaper then leaves
// (SIGTERM) and another joins, round after round.
func TestShardsReaperJoins(t *testing.T) {
	r, reapers := shardRig(t, rigOptions{})
	var gaps []time.Duration
	var movedCounts []int
	rounds := pick(1, 4)
	for round := range rounds {
		before := r.waitSpread(30*time.Second, 2, 3, reapers...)
		t0 := time.Now()
		joiner := r.startReaper(fmt.Sprintf("j%d", round))
		reapers = append(reapers, joiner)
		after := r.waitSpread(30*time.Second, 2, 2, reapers...)
		m := moved(before, after)
		movedCounts = append(movedCounts, len(m))
		handovers := map[int]takeover{}
		for _, shard := range m {
			revoked := before[shard].lostAfter(shard, t0)
			handovers[shard] = takeover{
				assigned: after[shard].assignedAfter(shard, t0).Sub(revoked),
				acquired: after[shard].acquiredAfter(shard, t0).Sub(revoked),
			}
			gaps = append(gaps, handovers[shard].acquired)
		}
		// The assignor moves only what the joiner takes: 2 shards from those leading 3. A reaper
		// that fenced itself meanwhile (a stall on a busy machine) rejoins, and its shards may
		// move anywhere.
		if fenced := fencedSince(t0, reapers...); fenced != nil {
			t.Logf("round %d: %s fenced itself during the join; shards moved: %v", round, fenced.name, m)
		} else if len(m) != 2 || after[m[0]] != joiner || after[m[1]] != joiner {
			t.Errorf("round %d: shards %v moved (from %s to %s); want 2, to the joiner %s", round, m, describeOwners(before, m), describeOwners(after, m), joiner.name)
		}
		t.Logf("round %d: %s joined; moved %s; now %s", round, joiner.name, takeoverLog(handovers), describe(reapers))
		r.waitProgress(1000, time.Minute)
		if round < rounds-1 {
			reapers[0].end(t, syscall.SIGTERM)
			reapers = reapers[1:]
		}
	}
	report := r.finish(2 * time.Minute)
	r.checkLossesLogged(r.all...)
	figure(t, "shards, reaper joins", "3 reapers, 8 shards, a 4th joins under load %d times: shards moved per join %v (2 is fewest), each then leads 2; handover (revoked to acquired) %s; records %d, duplicates %d, lost %d, reversals %d",
		rounds, movedCounts, spread(gaps),
		report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// fencedSince returns one of ps whose log says it fenced itself after t0, or nil.
func fencedSince(t0 time.Time, ps ...*reaper) *reaper {
	for _, p := range ps {
		p.mu.Lock()
		fenced := p.fencedAt.After(t0)
		p.mu.Unlock()
		if fenced {
			return p
		}
	}
	return nil
}

// describeOwners names who publishes each of shards in a spread: "[r0 r2]".
func describeOwners(spread map[int]*reaper, shards []int) []string {
	var names []string
	for _, shard := range shards {
		names = append(names, spread[shard].name)
	}
	return names
}

// The whole Kafka cluster fails under three sharded reapers: all three nodes are killed and
// restarted 3s later (past the heartbeat timeout, so every reaper fences itself from every
// shard). Each shard's takeover is measured from the kill.
func TestShardsBrokerFails(t *testing.T) {
	r, reapers := shardRig(t, rigOptions{kafka: faultedKafka})
	var ts []time.Duration
	rounds := pick(1, 3)
	every := make([]int, shardCount)
	for shard := range every {
		every[shard] = shard
	}
	for round := range rounds {
		r.waitProgress(2000, time.Minute)
		r.waitSpread(30*time.Second, 2, 3, reapers...)
		t0 := time.Now()
		for _, n := range r.kafka.Nodes() {
			n.Kill()
		}
		time.Sleep(3 * time.Second)
		for _, n := range r.kafka.Nodes() {
			if err := n.Start(); err != nil {
				t.Fatal(err)
			}
		}
		taken := r.takeovers(t0, every, 2*time.Minute, reapers...)
		ts = acquired(ts, taken)
		r.waitSpread(30*time.Second, 2, 3, reapers...)
		r.waitProgress(1000, time.Minute)
		t.Logf("round %d: cluster down 3s, shards published again after: %s; now %s",
			round, takeoverLog(taken), describe(reapers))
	}
	report := r.finish(3 * time.Minute)
	r.checkLossesLogged(r.all...)
	figure(t, "shards, the cluster fails", "3 reapers, 8 shards; %d stops of all 3 nodes for 3s; %s (from the kill); records %d, duplicates %d, lost %d, reversals %d",
		rounds, spreadFigure(ts), report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// The database fails under three sharded reapers: Postgres restarts, then it stops answering
// (every Postgres process SIGSTOPped) and, meanwhile, the reaper publishing the most shards is
// killed, so that its shards go to reapers whose epochs cannot start. They publish once the
// database answers again; takeovers are measured from the kill.
func TestShardsDatabaseFails(t *testing.T) {
	r, reapers := shardRig(t, rigOptions{})
	server := pgtest.Shared(t)
	var ts []time.Duration
	rounds, hung := pick(1, 3), 3*time.Second
	for round := range rounds {
		if err := server.Restart(); err != nil {
			t.Fatal(err)
		}
		r.waitProgress(1000, time.Minute)

		r.waitSpread(30*time.Second, 2, 3, reapers...)
		if err := server.Freeze(); err != nil {
			t.Fatal(err)
		}
		thawed := false
		thaw := func() {
			if !thawed {
				thawed = true
				if err := server.Thaw(); err != nil {
					t.Fatal(err)
				}
			}
		}
		t.Cleanup(thaw)
		victim := slices.MaxFunc(reapers, func(a, b *reaper) int { return len(a.shards()) - len(b.shards()) })
		lost := victim.shards()
		t0 := time.Now()
		victim.end(t, syscall.SIGKILL)
		reapers = slices.DeleteFunc(reapers, func(p *reaper) bool { return p == victim })
		time.Sleep(hung)
		thaw()
		taken := r.takeovers(t0, lost, time.Minute, reapers...)
		ts = acquired(ts, taken)
		r.waitSpread(30*time.Second, 4, 4, reapers...)
		r.waitProgress(1000, time.Minute)
		t.Logf("round %d: Postgres restarted; then frozen %v while %s was killed, its shards taken over: %s", round, hung, victim.name, takeoverLog(taken))
		reapers = append(reapers, r.startReaper(fmt.Sprintf("r%d", round+3)))
		r.waitSpread(30*time.Second, 2, 3, reapers...)
	}
	report := r.finish(3 * time.Minute)
	r.checkLossesLogged(r.all...)
	figure(t, "shards, database fails", "3 reapers, 8 shards; %d Postgres restarts; %d freezes of %v with a reaper killed meanwhile: %s (from the kill); records %d, duplicates %d, lost %d, reversals %d",
		rounds, rounds, hung, spreadFigure(ts),
		report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// Every shard a harvester said it acquired, it must say it lost when the election takes it,
// whatever the shard's epoch was doing: logs, events and whoever reads them (this harness, an
// operator, a dashboard) otherwise show a shard led by two reapers at once. The case that
// fails: a shard whose epoch ended for a remark (produce requests failing) and whose next epoch
// cannot start (the broker is down) when the reaper fences itself. kfake only: it fails chosen
// produce requests.
func TestShardsLossLoggedBetweenEpochs(t *testing.T) {
	r, reapers := shardRig(t, rigOptions{kafka: kfakeOnly})
	every := make([]int, shardCount)
	for shard := range every {
		every[shard] = shard
	}
	for range pick(1, 3) {
		r.waitSpread(30*time.Second, 2, 3, reapers...)
		remarks := func() (n int) {
			for _, p := range reapers {
				remarked, _ := p.counts()
				n += remarked
			}
			return n
		}
		before := remarks()
		failing := r.fake.FailProduce(2, kerr.UnknownServerError)
		// Until an epoch has ended for a remark, the case this test is about.
		testwait.For(t, 30*time.Second, "an epoch ended by the failing produce requests", func() bool { return remarks() > before })
		t0 := time.Now()
		if err := r.fake.Restart(3 * time.Second); err != nil { // the restart also ends the failures
			t.Fatal(err)
		}
		failing.Remove()
		r.takeovers(t0, every, time.Minute, reapers...)
		r.waitProgress(1000, time.Minute)
	}
	r.checkLossesLogged(reapers...)
	r.finish(2 * time.Minute)
}
