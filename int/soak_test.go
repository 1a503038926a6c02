package int

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

// The soak: three reapers publish eight shards under load while faults of every kind, chosen at
// random, strike one after another, each followed by a pause; the checker runs at the end. The
// faults come from a generator seeded by SOAK_SEED (random when unset), and the test prints the
// seed and the schedule first, so that a failing run can be replayed: the same seed gives the
// same faults in the same order, with the same parameters (the timing of what they hit still
// varies). GOHARVEST_SOAK bounds the run (make soak: 30 minutes); without it a short run goes
// in make test.

// soakFault is one fault of a soak's schedule.
type soakFault struct {
	kind soakKind
	slot int           // the reaper hit, for kinds that hit one (0 to soakReapers-1)
	hold time.Duration // how long the fault lasts: a reaper or Postgres frozen, the broker down, a reaper gone before its replacement starts
	wait time.Duration // the pause after the fault has settled, before the next one
}

type soakKind int

const (
	soakKill         soakKind = iota // SIGKILL a reaper; a fresh one replaces it after hold
	soakTerm                         // SIGTERM a reaper; a fresh one replaces it after hold
	soakStop                         // SIGSTOP a reaper until the others have its shards and hold has passed, then SIGCONT
	soakRestart                      // SIGTERM a reaper and start a fresh one at once (a rolling restart)
	soakBroker                       // a broker (slot picks which) is killed, and restarted after hold
	soakBrokerFreeze                 // a broker (slot picks which) is frozen (SIGSTOP) for hold
	soakDBFreeze                     // every Postgres process SIGSTOPped for hold
	soakDBRestart                    // Postgres restarts
	soakKinds
)

func (k soakKind) String() string {
	return [...]string{"kill", "term", "stop-cont", "restart", "broker kill", "broker freeze", "db freeze", "db restart"}[k]
}

// hitsReaper reports whether the kind strikes one reaper, whose shards then move.
func (k soakKind) hitsReaper() bool { return k <= soakRestart }

func (f soakFault) String() string {
	s := f.kind.String()
	switch {
	case f.kind.hitsReaper():
		s += " reaper " + strconv.Itoa(f.slot)
	case f.kind == soakBroker || f.kind == soakBrokerFreeze:
		s += " node " + strconv.Itoa(f.slot+1)
	}
	if f.kind != soakRestart && f.kind != soakDBRestart {
		s += " hold " + f.hold.String()
	}
	return s + ", then wait " + f.wait.String()
}

const soakReapers = 3

// soakSchedule draws faults from seed: n of them, each of a kind chosen uniformly.
func soakSchedule(seed uint64, n int) []soakFault {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	ms := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond }
	faults := make([]soakFault, n)
	for i := range faults {
		f := soakFault{kind: soakKind(rng.IntN(int(soakKinds))), slot: rng.IntN(soakReapers)}
		switch f.kind {
		case soakKill, soakTerm:
			f.hold = ms(0, 5000)
		case soakStop:
			f.hold = ms(2500, 6000) // past the session timeout (2s): its shards move
		case soakBroker:
			f.hold = ms(0, 4000) // under the heartbeat timeout, leaders may keep their shards
		case soakBrokerFreeze:
			f.hold = ms(1000, 12000) // past broker.session.timeout.ms (9s), the cluster fences the node
		case soakDBFreeze:
			f.hold = ms(500, 5000)
		}
		f.wait = ms(500, 5000)
		faults[i] = f
	}
	return faults
}

// soakSettings reads the soak's duration and seed from the environment.
func soakSettings(t *testing.T) (time.Duration, uint64) {
	duration := 45 * time.Second
	if s := os.Getenv("GOHARVEST_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("GOHARVEST_SOAK=%q: %v", s, err)
		}
		duration = d
		// Settling, the last fault and the final check take a few minutes at most: better to say
		// so now than to be cut short by the test timeout at the end.
		if deadline, ok := t.Deadline(); ok && time.Until(deadline) < duration+5*time.Minute {
			t.Fatalf("a soak of %v needs a test timeout of at least %v more (make soak SOAK_TIMEOUT=...)", duration, 5*time.Minute)
		}
	}
	seed := rand.Uint64() % 1_000_000_000
	if s := os.Getenv("SOAK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("SOAK_SEED=%q: %v", s, err)
		}
		seed = n
	}
	return duration, seed
}

func TestSoak(t *testing.T) {
	duration, seed := soakSettings(t)
	// A fault takes at least a second or two; a schedule that long always outlasts the run.
	schedule := soakSchedule(seed, int(duration/time.Second)+1)
	// A fault and its pause take several seconds: this many cover any run.
	shown := min(len(schedule), int(duration/(3*time.Second))+10)
	var plan strings.Builder
	for i, f := range schedule[:shown] {
		fmt.Fprintf(&plan, "\n  %3d %v", i, f)
	}
	t.Logf("soak for %v, SOAK_SEED=%d; the schedule (a run does as many faults as fit):%s", duration, seed, plan.String())

	r, reapers := shardRig(t, rigOptions{kafka: faultedKafka, extraYAML: "  producerKafkaConfig:\n    linger.ms: 100"})
	s := &soak{r: r, slots: reapers, server: pgtest.Shared(t), byKind: map[soakKind]int{}, takeover: map[soakKind][]time.Duration{}}
	end := time.Now().Add(duration)
	done := 0
	for _, f := range schedule {
		if time.Now().After(end) {
			break
		}
		s.strike(f)
		done++
		t.Logf("fault %d: %v: %s", done-1, f, s.last)
		time.Sleep(f.wait)
	}
	report := r.finish(3 * time.Minute)
	r.checkLossesLogged(r.all...)
	var kinds, takeovers []string
	var all []time.Duration
	for k := range soakKinds {
		if n := s.byKind[k]; n > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		}
		if ts := s.takeover[k]; len(ts) > 0 {
			takeovers = append(takeovers, fmt.Sprintf("%s %s", k, spread(ts)))
			all = append(all, ts...)
		}
	}
	maxTakeover := time.Duration(0)
	if len(all) > 0 {
		maxTakeover = slices.Max(all).Round(time.Millisecond)
	}
	figure(t, "soak", "SOAK_SEED=%d, %v, 3 reapers, 8 shards, %d faults (%s); %d shard takeovers, max %v (%s); reapers started %d; records %d, duplicates %d, lost %d, reversals %d",
		seed, duration, done, strings.Join(kinds, ", "), len(all), maxTakeover, strings.Join(takeovers, "; "), s.started+soakReapers,
		report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// soak runs a schedule's faults against a rig.
type soak struct {
	r       *rig
	slots   []*reaper // the reaper in each slot now
	server  *pgtest.Server
	started int // fresh reapers started to replace others

	byKind   map[soakKind]int
	takeover map[soakKind][]time.Duration // per shard moved
	last     string                       // what the last fault did, for the log
}

// strike applies one fault, undoes it, and waits until every shard is published again, spread
// 2 or 3 to a reaper, and records have gone out since.
func (s *soak) strike(f soakFault) {
	r := s.r
	t0 := time.Now()
	victim := s.slots[f.slot]
	var lost []int // shards whose takeover is measured
	others := slices.DeleteFunc(slices.Clone(s.slots), func(p *reaper) bool { return p == victim })
	replace := func() {
		s.started++
		s.slots[f.slot] = r.startReaper(fmt.Sprintf("s%d-%d", f.slot, s.started))
	}
	var taken map[int]takeover
	switch f.kind {
	case soakKill, soakTerm, soakRestart:
		lost = victim.shards()
		sig := syscall.SIGKILL
		if f.kind != soakKill {
			sig = syscall.SIGTERM
		}
		victim.end(r.t, sig)
		if f.kind == soakRestart {
			replace()
			taken = r.takeovers(t0, lost, time.Minute, append(others, s.slots[f.slot])...)
			break
		}
		taken = r.takeovers(t0, lost, time.Minute, others...)
		time.Sleep(f.hold - time.Since(t0))
		replace()
	case soakStop:
		lost = victim.shards()
		victim.signal(syscall.SIGSTOP)
		taken = r.takeovers(t0, lost, time.Minute, others...)
		time.Sleep(f.hold - time.Since(t0))
		victim.signal(syscall.SIGCONT)
		r.waitLost(victim, lost, t0, 30*time.Second)
	case soakBroker, soakBrokerFreeze:
		node := r.kafka.Nodes()[f.slot]
		if f.kind == soakBroker {
			node.Kill()
			time.Sleep(f.hold)
			if err := node.Start(); err != nil {
				r.t.Fatal(err)
			}
		} else {
			node.Freeze()
			time.Sleep(f.hold)
			node.Thaw()
		}
		if err := r.kafka.WaitReady(2 * time.Minute); err != nil {
			r.t.Fatal(err)
		}
		// The shards measured are those some reaper says it lost; a short outage may cost none.
		r.waitSpread(time.Minute, 2, 3, s.slots...)
		for shard := range r.shards {
			for _, p := range s.slots {
				if !p.lostAfter(shard, t0).IsZero() {
					lost = append(lost, shard)
					break
				}
			}
		}
		taken = r.takeovers(t0, lost, time.Minute, s.slots...)
	case soakDBFreeze:
		if err := s.server.Freeze(); err != nil {
			r.t.Fatal(err)
		}
		time.Sleep(f.hold)
		if err := s.server.Thaw(); err != nil {
			r.t.Fatal(err)
		}
	case soakDBRestart:
		if err := s.server.Restart(); err != nil {
			r.t.Fatal(err)
		}
	}
	r.waitSpread(time.Minute, 2, 3, s.slots...)
	r.waitProgress(200, time.Minute)
	s.byKind[f.kind]++
	for _, shard := range slices.Sorted(maps.Keys(taken)) {
		s.takeover[f.kind] = append(s.takeover[f.kind], taken[shard].acquired)
	}
	s.last = "settled after " + time.Since(t0).Round(time.Millisecond).String()
	if len(taken) > 0 {
		s.last += "; taken over: " + takeoverLog(taken)
	}
	s.last += "; now " + describe(s.slots)
}
