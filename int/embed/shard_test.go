package embed_test

import (
	"context"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	outboxpkg "github.com/goharvest/goharvest/outbox"
)

// shardIndex creates the index a sharded outbox needs (see Config.Shards).
func (r *intRig) shardIndex(shards int) {
	r.t.Helper()
	ddl, err := outboxpkg.ShardIndexDDL("outbox", shards)
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.pool.Exec(context.Background(), ddl); err != nil {
		r.t.Fatal(err)
	}
}

// shardedRun is a group of harvesters publishing one sharded outbox.
type shardedRun struct {
	r      *intRig
	shards int
	events eventRecorder
	mu     sync.Mutex
	live   map[string]*runningHarvester
	// client is each harvester's Kafka client (Config.KafkaClient).
	client reaper.KafkaClient
}

type runningHarvester struct {
	h      *goharvest.Harvest
	cancel context.CancelFunc
	done   chan error
}

func (sr *shardedRun) start(name string) {
	sr.r.t.Helper()
	h := sr.r.harvesterWith("sharded", goharvest.Limits{IOErrorBackoff: 50 * time.Millisecond}, nil,
		func(c *harvestSettings) {
			c.Shards, c.Name, c.KafkaClient = sr.shards, name, sr.client
			c.BaseKafkaConfig["client.id"] = name
		})
	h.SetEventHandler(sr.events.record)
	ctx, cancel := context.WithCancel(context.Background())
	rh := &runningHarvester{h: h, cancel: cancel, done: make(chan error, 1)}
	go func() { rh.done <- h.Run(ctx) }()
	sr.mu.Lock()
	sr.live[name] = rh
	sr.mu.Unlock()
}

func (sr *shardedRun) stop(name string) {
	sr.r.t.Helper()
	sr.mu.Lock()
	rh := sr.live[name]
	delete(sr.live, name)
	sr.mu.Unlock()
	rh.cancel()
	if err := <-rh.done; err != nil {
		sr.r.t.Errorf("%s: %v", name, err)
	}
}

// leaders returns who publishes each shard now; a shard two harvesters publish at once fails
// the test.
func (sr *shardedRun) leaders() map[int]string {
	owners := map[int]string{}
	for shard, e := range sr.epochs() {
		owners[shard] = e.owner
	}
	return owners
}

type shardEpoch struct {
	owner    string
	leaderID uuid.UUID
}

// epochs returns each published shard's owner and leader ID.
func (sr *shardedRun) epochs() map[int]shardEpoch {
	sr.mu.Lock()
	defer sr.mu.Unlock()
	epochs := map[int]shardEpoch{}
	for name, rh := range sr.live {
		for shard, id := range rh.h.LeadShards() {
			if other, ok := epochs[shard]; ok {
				sr.r.t.Errorf("shard %d published by %s and %s at once", shard, other.owner, name)
			}
			epochs[shard] = shardEpoch{name, id}
		}
	}
	return epochs
}

// waitBalanced waits until every shard is published and each harvester publishes lo to hi.
func (sr *shardedRun) waitBalanced(within time.Duration, lo, hi int) map[int]string {
	sr.r.t.Helper()
	var owners map[int]string
	if !testwait.UntilEvery(within, 20*time.Millisecond, func() bool {
		owners = sr.leaders()
		counts := map[string]int{}
		for _, name := range owners {
			counts[name]++
		}
		ok := len(owners) == sr.shards
		sr.mu.Lock()
		for name := range sr.live {
			ok = ok && counts[name] >= lo && counts[name] <= hi
		}
		sr.mu.Unlock()
		return ok
	}) {
		sr.r.t.Fatalf("shards not spread within %v: %v", within, owners)
	}
	return owners
}

// Three harvesters publish eight shards at once, two or three each; while they drain a backlog,
// one stops and another joins. Every record arrives, no key goes backwards. On each Kafka client.
func TestShardedHarvestersShareTheOutboxAndHandOver(t *testing.T) {
	for _, client := range kafkaClients {
		t.Run(string(client), func(t *testing.T) { shareTheOutboxAndHandOver(t, client) })
	}
}

// shareTheOutboxAndHandOver runs TestShardedHarvestersShareTheOutboxAndHandOver on client.
func shareTheOutboxAndHandOver(t *testing.T, client reaper.KafkaClient) {
	const shards, keys, perKey = 8, 400, 50
	r := newIntRig(t)
	r.shardIndex(shards)
	expected := r.load(keys, perKey)
	v := r.verifier()
	sr := &shardedRun{r: r, shards: shards, client: client, live: map[string]*runningHarvester{}}
	for _, name := range []string{"h0", "h1", "h2"} {
		sr.start(name)
	}
	before := sr.waitBalanced(30*time.Second, 2, 3)
	t.Logf("3 harvesters: %v", before)
	if r.outboxRows() == 0 {
		t.Log("the backlog drained before the handover; the handover is tested without load")
	}
	epochs := sr.epochs()
	sr.stop("h0")
	sr.start("h3")
	after := sr.waitBalanced(30*time.Second, 2, 3)
	t.Logf("after h0 left and h3 joined: %v", after)
	// A shard that stayed with its owner kept its epoch through both rebalances: same leader ID.
	for shard, e := range sr.epochs() {
		if old := epochs[shard]; old.owner == e.owner && old.leaderID != e.leaderID {
			t.Errorf("shard %d stayed with %s but its epoch was restarted by the rebalance", shard, e.owner)
		}
	}
	r.waitEmpty(2 * time.Minute)
	v.WaitDistinct(t, keys*perKey, time.Minute)
	for _, name := range slices.Sorted(maps.Keys(sr.live)) {
		sr.stop(name)
	}
	dups := checkDelivered(t, v, expected)
	t.Logf("%d records over %d shards, %d duplicates", keys*perKey, shards, dups)
	if n := sr.events.count("LeaderFenced"); n > 0 {
		// A harvester fences itself when Kafka acknowledges none of its heartbeats within the
		// heartbeat timeout (1s here): a fault, or a machine too starved to run its loop.
		load, _ := os.ReadFile("/proc/loadavg")
		t.Errorf("harvesters fenced themselves %d times in a run without faults: each had no heartbeat acknowledged for the 1s timeout; with no fault injected, that is the election's loop starved of CPU (load average %s) or a fault in the election",
			n, strings.TrimSpace(string(load)))
	}
}

// The documented way to change the shard count: stop every harvester, create the index for the
// new count, start them with the new Shards. The leader topic grows to the new count; nothing is
// lost and no key goes backwards, though records published and not yet purged when the first
// harvesters stopped may come again.
func TestChangingTheShardCountLosesNothing(t *testing.T) {
	const keys, perKey = 200, 50
	r := newIntRig(t)
	expected := r.load(keys, perKey)
	v := r.verifier()

	one := &shardedRun{r: r, shards: 1, live: map[string]*runningHarvester{}}
	one.start("h0")
	if !testwait.Until(time.Minute, func() bool { return r.outboxRows() <= keys*perKey*2/3 }) {
		t.Fatalf("one shard published too little in a minute: %d rows left", r.outboxRows())
	}
	one.stop("h0")
	left := r.outboxRows()

	r.shardIndex(4)
	four := &shardedRun{r: r, shards: 4, live: map[string]*runningHarvester{}}
	four.start("h1")
	four.start("h2")
	four.waitBalanced(30*time.Second, 2, 2)
	r.waitEmpty(2 * time.Minute)
	v.WaitDistinct(t, keys*perKey, time.Minute)
	four.stop("h1")
	four.stop("h2")
	dups := checkDelivered(t, v, expected)
	t.Logf("1 shard published %d records, then 4 shards the other %d; %d duplicates", keys*perKey-left, left, dups)
}
