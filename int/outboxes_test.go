package int

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// outboxRig is several outboxes, each a rig of its own (its database, topic, leader group,
// writers and verifier), published by reapers that each run all of them from one file.
type outboxRig struct {
	t      *testing.T
	names  []string
	rigs   []*rig
	config string
}

// newOutboxRig makes n outboxes on the shared cluster and the reaper file that lists them.
func newOutboxRig(t *testing.T, n int) *outboxRig {
	t.Helper()
	o := &outboxRig{t: t}
	var entries strings.Builder
	for i := range n {
		r := newRig(t, rigOptions{})
		name := fmt.Sprintf("tenant-%d", i)
		o.names = append(o.names, name)
		o.rigs = append(o.rigs, r)
		fmt.Fprintf(&entries, "  - outbox: %s\n    leaderGroupID: %s\n    leaderTopic: %s.leader\n    dataSource: %q\n",
			name, r.group, r.group, r.dsn)
	}
	o.config = filepath.Join(t.TempDir(), "reaper-outboxes.yaml")
	yaml := `harvest:
  baseKafkaConfig:
    bootstrap.servers: ` + o.rigs[0].addr + `
` + claimStrategyYAML() + kafkaClientYAML() + `  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
    ioErrorBackoff: 100ms
outboxes:
` + entries.String() + `logging:
  level: info
  format: json
`
	if err := os.WriteFile(o.config, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	return o
}

// startReaper starts a reaper of every outbox; the first rig keeps its log.
func (o *outboxRig) startReaper(name string) *reaper {
	o.t.Helper()
	return o.rigs[0].startReaperWith(name, o.config)
}

// waitLeaders waits until each outbox has exactly one leader among ps, and returns them.
func (o *outboxRig) waitLeaders(within time.Duration, ps ...*reaper) []*reaper {
	o.t.Helper()
	leaders := make([]*reaper, len(o.names))
	deadline := time.Now().Add(within)
	for i, name := range o.names {
		var last []string
		ok := func() bool {
			var ls []*reaper
			last = last[:0]
			for _, p := range ps {
				if p.leads(name) {
					ls = append(ls, p)
					last = append(last, p.name)
				}
			}
			if len(ls) == 1 {
				leaders[i] = ls[0]
			}
			return len(ls) == 1
		}
		if !testwait.UntilEvery(time.Until(deadline), 5*time.Millisecond, ok) {
			o.t.Fatalf("outbox %s: leaders %v, want one, within %v", name, last, within)
		}
	}
	return leaders
}

// Failover with three outboxes in one reaper file: three reapers, each running all three; the
// leader of one outbox (in turn) is killed (SIGKILL) or stopped (SIGTERM) under load, and a
// fresh reaper started in its place. Every outbox, whichever reaper led it, ends with 0 lost and
// 0 reversals, checked and reported per outbox.
func TestFailoverSeveralOutboxes(t *testing.T) {
	const outboxes = 3
	o := newOutboxRig(t, outboxes)
	for _, r := range o.rigs {
		r.startWriters(2, 200, 600)
	}
	reapers := []*reaper{o.startReaper("r0"), o.startReaper("r1"), o.startReaper("r2")}
	rounds := pick(3, 9)
	for round := range rounds {
		o.waitLeaders(30*time.Second, reapers...)
		for _, r := range o.rigs {
			r.waitProgress(200, 30*time.Second)
		}
		target := round % outboxes
		leader := o.waitLeaders(30*time.Second, reapers...)[target]
		sig, how := syscall.SIGKILL, "killed"
		if round%2 == 1 {
			sig, how = syscall.SIGTERM, "stopped"
		}
		var led []string
		for _, name := range o.names {
			if leader.leads(name) {
				led = append(led, name)
			}
		}
		lost := time.Now()
		leader.signal(sig)
		if code := leader.waitExit(t, 30*time.Second); sig == syscall.SIGTERM && code != 0 {
			t.Fatalf("round %d: %s exited %d after SIGTERM", round, leader.name, code)
		}
		reapers = slices.DeleteFunc(reapers, func(p *reaper) bool { return p == leader })
		o.waitLeaders(30*time.Second, reapers...)
		// Every outbox publishes again, those the lost reaper led included.
		for _, r := range o.rigs {
			r.waitProgress(200, 30*time.Second)
		}
		t.Logf("round %d: %s (leading %v) %s; every outbox publishing again after %v", round, leader.name, led, how,
			time.Since(lost).Round(time.Millisecond))
		reapers = append(reapers, o.startReaper(fmt.Sprintf("r%d", round+3)))
	}
	var lines []string
	for i, r := range o.rigs {
		report := r.finish(2 * time.Minute)
		lines = append(lines, fmt.Sprintf("%s: records %d, duplicates %d, lost %d, reversals %d",
			o.names[i], report.Expected, report.Duplicates, report.LostCount, len(report.Reversals)))
		if !report.OK() {
			t.Errorf("outbox %s:\n%s", o.names[i], report)
		}
	}
	figure(t, "failover, several outboxes", "%d outboxes in one file, leaders lost %d; %s", outboxes, rounds, strings.Join(lines, "; "))
}
