package reaper_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

// shardsLed returns the shards of outbox the reaper at base publishes now, from /shards.
func shardsLed(base, outbox string) ([]int, string) {
	code, body := get(base + reaper.ShardsPath + "?" + reaper.OutboxParam + "=" + outbox)
	if code != 200 {
		return nil, fmt.Sprintf("%d %s", code, body)
	}
	var report struct {
		Leads []struct {
			Shard int `json:"shard"`
		} `json:"leads"`
	}
	if err := json.Unmarshal([]byte(body), &report); err != nil {
		return nil, err.Error()
	}
	var led []int
	for _, l := range report.Leads {
		led = append(led, l.Shard)
	}
	return led, body
}

// Two reapers (different harvester names, the same outboxes) share the work of a file of three
// outboxes, two of them in 4 shards: each reaper leads some shards of each sharded outbox, never
// the same ones, and every record arrives in order per key. Stopping one hands its shards to the
// other, and nothing is lost.
func TestTwoReapersShareOutboxesByShards(t *testing.T) {
	broker := kafkacluster.Shared(t)
	dsn := pgtest.NewDatabase(t)
	pool := newPool(t, dsn)
	type spec struct {
		name   string
		shards int
	}
	specs := []spec{{"alpha", 4}, {"beta", 4}, {"gamma", 1}}
	var entries strings.Builder
	outboxes := make([]testOutbox, len(specs))
	for i, s := range specs {
		outboxes[i] = testOutbox{name: s.name, table: "outbox_" + s.name, topic: broker.Topic(t, "shared."+s.name, 4), pool: pool}
		fmt.Fprintf(&entries, "  - outbox: %s\n    leaderGroupID: shared-%s\n    outboxTable: %s\n    shards: %d\n",
			s.name, s.name, outboxes[i].table, s.shards)
	}
	config := func(name, addr string) string {
		return outboxesFile(t, broker, name, "  name: "+name+"\n  dataSource: \""+dsn+"\"\n", entries.String(), addr)
	}
	addrA, addrB := freeAddr(t), freeAddr(t)
	configA, configB := config("reaper-a", addrA), config("reaper-b", addrB)
	var out strings.Builder
	if code := reaper.Main([]string{"init", "-f", configA}, reaper.Env{Stdout: &out, Stderr: &out, LookupEnv: os.LookupEnv, Context: context.Background()}); code != 0 {
		t.Fatalf("init: exit %d:\n%s", code, out.String())
	}

	const keys = 20 // enough that every shard has keys
	writers := make([]*loadWriter, len(outboxes))
	for i, o := range outboxes {
		writers[i] = startLoadWriter(t, broker, o, t.Name(), keys)
	}
	stopA := runReaper(t, configA)
	defer stopA()
	stopB := runReaper(t, configB)
	defer stopB()
	baseA, baseB := "http://"+addrA, "http://"+addrB

	// Each sharded outbox's shards split between the two, each leading some, none both; the
	// one-shard outbox led by one of them.
	for _, s := range specs {
		eventually(t, "the shards of "+s.name+" split between the reapers", time.Minute, func() (bool, string) {
			a, bodyA := shardsLed(baseA, s.name)
			b, bodyB := shardsLed(baseB, s.name)
			all := slices.Sorted(slices.Values(append(slices.Clone(a), b...)))
			want := make([]int, s.shards)
			for i := range want {
				want[i] = i
			}
			ok := slices.Equal(all, want) && (s.shards == 1 || len(a) > 0 && len(b) > 0)
			return ok, "A: " + bodyA + " B: " + bodyB
		})
		a, _ := shardsLed(baseA, s.name)
		b, _ := shardsLed(baseB, s.name)
		t.Logf("outbox %s: reaper A leads shards %v, reaper B %v", s.name, a, b)
	}
	waitProgress(t, writers, nil, time.Minute)

	// A stops: B takes every shard of every outbox, and publishes on.
	stopA()
	for _, s := range specs {
		eventually(t, "reaper B leading every shard of "+s.name, time.Minute, func() (bool, string) {
			b, body := shardsLed(baseB, s.name)
			return len(b) == s.shards, body
		})
	}
	waitProgress(t, writers, nil, time.Minute)

	for _, w := range writers {
		w.halt()
	}
	for _, w := range writers {
		w.verifier.WaitDistinct(t, w.batches*int64(w.keys), time.Minute)
		if report := w.verifier.Report(w.expected()); !report.OK() {
			t.Errorf("outbox %s:\n%s", w.o.name, report)
		} else {
			t.Logf("outbox %s: %d records, %d duplicates, none lost, none reversed", w.o.name, report.Expected, report.Duplicates)
		}
	}
	stopB()
}
