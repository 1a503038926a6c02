package int

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/outbox"
)

// The cluster events an operator meets, at the settings README recommends: a 3-node cluster with
// Kafka's default group and broker timings (6s minimum session, a broker fenced 9s after its last
// heartbeat to the controller), three reapers on 8 shards, a 5s heartbeat timeout, goharvest's
// default limits, 800 records a second (GOHARVEST_PRODUCTION_RATE and GOHARVEST_PRODUCTION_BROKER
// change the rate and the brokers' settings; see productionSettings). Each event reports the
// shard leaderships it cost, how long each shard stopped publishing, when every shard published
// again, and the checker's verdict, beside what it cost goharvest's producer alone (see
// loneProducers).
// make test runs the crash of a broker that coordinates nothing of goharvest's; make chaos adds a
// rolling restart and the crashes of the group's coordinator and of the busiest transaction
// coordinator.

// A broker that leads no partition of the leader topic and coordinates neither of goharvest's
// groups crashes (SIGKILL): no leader may change. How soon every shard commits again after the
// surviving brokers' metadata shows the crashed one fenced is measured and reported.
func TestBrokerCrashChangesNoLeader(t *testing.T) {
	var bystander *kafkacluster.Node
	p := startProduction(t, func(ro roles) *kafkacluster.Node { bystander = ro.bystander(); return bystander })
	commits := watchCommits(t, p.r, productionShards)
	fence := watchFence(t, p.r, bystander.ID)
	res := p.event(fmt.Sprintf("SIGKILL of node %d, which coordinates nothing (%s)", bystander.ID, p.roles.describe(bystander.ID)),
		bystander, bystander.Kill)
	if res.lost > 0 {
		t.Errorf("the crash of node %d, which led no partition of the leader topic and coordinated neither group, cost %d shard leaderships (%d self-fences): %s",
			bystander.ID, res.lost, res.fenced, res.changes)
	}
	fencedAt := fence.wait(t)
	back := commits.firstAfter(t, fencedAt, fence.partitions)
	t.Logf("node %d fenced (gone from the metadata, leading nothing) at %s (the poll before at %s); each shard's first commit after it %v; the controller logged the fence at %s",
		bystander.ID, fencedAt.Format("15:04:05.000"), fence.before.Format("15:04:05.000"), back, controllerFence(p, bystander.ID, res.at))
	// Reported, not judged: on a loaded machine a shard went seconds without a commit with no
	// fault at all, so a bound here would measure the machine (the quiet gap beside it says how
	// much). make chaos collects the figure.
	worst := slices.Max(back)
	figure(t, "broker crash, back after the fence", "node %d fenced; every shard committing again within %v of the fence (worst shard), %v with no fault (the longest gap before the crash)",
		bystander.ID, worst.Round(10*time.Millisecond), res.quiet.Round(100*time.Millisecond))
	p.finish("broker crash (coordinates nothing)")
}

// Each broker in turn stops as an operator stops it (SIGTERM: a controlled shutdown, which hands
// its partitions' leadership and its coordinators over first) and starts again: no leader may
// change.
func TestRollingRestartChangesNoLeader(t *testing.T) {
	if !long() {
		t.Skip("make chaos")
	}
	p := startProduction(t, nil)
	for _, n := range p.r.kafka.Nodes() {
		res := p.event(fmt.Sprintf("SIGTERM of node %d (%s)", n.ID, p.roles.describe(n.ID)), n, func() { n.Terminate(2 * time.Minute) })
		if res.lost > 0 {
			t.Errorf("the controlled shutdown of node %d cost %d shard leaderships (%d self-fences): %s", n.ID, res.lost, res.fenced, res.changes)
		}
	}
	p.finish("rolling restart")
}

// The broker that coordinates the election's group crashes (SIGKILL).
func TestGroupCoordinatorCrash(t *testing.T) {
	if !long() {
		t.Skip("make chaos")
	}
	p := startProduction(t, nil)
	group := coordinatorOf(t, p.r, kafkacluster.GroupCoordinator, p.r.group)
	p.event(fmt.Sprintf("SIGKILL of node %d, the group coordinator (%s)", group.ID, p.roles.describe(group.ID)), group, group.Kill)
	p.finish("group coordinator crash")
}

// The broker that coordinates the most shards' transactional IDs crashes (SIGKILL).
func TestTransactionCoordinatorCrash(t *testing.T) {
	if !long() {
		t.Skip("make chaos")
	}
	p := startProduction(t, nil)
	txn := p.roles.busiestTxn()
	p.event(fmt.Sprintf("SIGKILL of node %d, the busiest transaction coordinator (%s)", txn.ID, p.roles.describe(txn.ID)), txn, txn.Kill)
	p.finish("transaction coordinator crash")
}

const productionShards, productionHeartbeatTimeout = 8, 5 * time.Second

// production is a rig at production settings with its three reapers leading every shard.
type production struct {
	t       *testing.T
	r       *rig
	watch   *shardWatch
	reapers []*reaper
	lone    *loneProducers
	roles   roles
	results []eventResult
	// calm is when the rig last began to run without a fault: the writers' start, or the end of
	// the last event.
	calm time.Time
	// rate and broker are the record rate and the broker settings over Kafka's defaults (see
	// productionSettings).
	rate   int
	broker map[string]string
}

// productionSettings reads the production scenarios' record rate, GOHARVEST_PRODUCTION_RATE
// (records a second; 800 unless set), and broker settings over Kafka's defaults,
// GOHARVEST_PRODUCTION_BROKER ("name=value,name=value"; a value cannot hold a comma), so that an
// event can be measured at another rate or with a broker setting tuned (operations.md, Cluster
// events). At a low rate a shard's ordinary gaps come near a short stall: the figures' "every
// shard publishing again after", the end of each shard's longest gap in the event's window, can
// then be an ordinary gap's end; read it beside the quiet gap the figure also gives.
func productionSettings(t *testing.T) (rate int, broker map[string]string) {
	t.Helper()
	rate = 800
	if v := os.Getenv("GOHARVEST_PRODUCTION_RATE"); v != "" {
		n, err := strconv.Atoi(v)
		// The rig waits a minute for 2000 records before the first event, and for 1000 after
		// each: a slower rate would fail on those waits rather than here.
		if err != nil || n < minProductionRate {
			t.Fatalf("GOHARVEST_PRODUCTION_RATE=%q: want a whole number of records a second, at least %d", v, minProductionRate)
		}
		rate = n
	}
	if v := os.Getenv("GOHARVEST_PRODUCTION_BROKER"); v != "" {
		broker = map[string]string{}
		for _, kv := range strings.Split(v, ",") {
			name, value, ok := strings.Cut(kv, "=")
			name, value = strings.TrimSpace(name), strings.TrimSpace(value)
			if !ok || name == "" {
				t.Fatalf("GOHARVEST_PRODUCTION_BROKER=%q: %q is not name=value", v, kv)
			}
			if _, twice := broker[name]; twice {
				t.Fatalf("GOHARVEST_PRODUCTION_BROKER=%q: %s is set twice", v, name)
			}
			broker[name] = value
		}
	}
	return rate, broker
}

const minProductionRate = 50

// settings describes the rig for the figures: the brokers' timings and the record rate.
func (p *production) settings() string {
	timings := "Kafka's default timings"
	var tuned []string
	for _, name := range slices.Sorted(maps.Keys(p.broker)) {
		tuned = append(tuned, name+"="+p.broker[name])
	}
	if len(tuned) > 0 {
		timings += " but " + strings.Join(tuned, ", ")
	}
	return fmt.Sprintf("3 nodes at %s, 3 reapers, 8 shards, heartbeatTimeout 5s, %d records/s", timings, p.rate)
}

// quietBefore is how long the rig runs without a fault before each event, so that the event's
// figures can be read beside what this machine costs without one: the longest gap between a
// shard's records in that time.
const quietBefore = 20 * time.Second

// startProduction starts the rig, its reapers and its writers. With avoid, the leader topic is
// created first, led by every node but the one avoid picks, so that that node holds nothing the
// election needs (it still holds a replica of every partition).
func startProduction(t *testing.T, avoid func(roles) *kafkacluster.Node) *production {
	t.Helper()
	rate, broker := productionSettings(t)
	r := newRig(t, rigOptions{kafka: defaultKafka, heartbeatTimeout: productionHeartbeatTimeout, shards: productionShards, defaultLimits: true, brokerConfig: broker})
	p := &production{t: t, r: r, roles: coordinatorRoles(t, r, productionShards), rate: rate, broker: broker}
	if avoid != nil {
		if err := r.kafka.CreateTopicLedByOthers(r.group+".leader", productionShards, avoid(p.roles).ID); err != nil {
			t.Fatal(err)
		}
	}
	p.watch = watchShards(t, r, productionShards)
	p.reapers = []*reaper{r.startReaper("a"), r.startReaper("b"), r.startReaper("c")}
	waitAllShardsLed(t, 2*time.Minute, productionShards, p.reapers...)
	// The writers start once every shard is led, so that the latency figures are the events'
	// and not the first election's.
	r.startWriters(4, 1000, rate)
	p.lone = startLoneProducers(t, r)
	r.waitProgress(2000, time.Minute)
	p.calm = time.Now()
	return p
}

// event runs do, measures what it cost, starts node again if do stopped it, and waits until the
// cluster is whole (every replica in sync) and publishing.
func (p *production) event(name string, node *kafkacluster.Node, do func()) eventResult {
	t := p.t
	t.Helper()
	time.Sleep(time.Until(p.calm.Add(quietBefore))) // see quietBefore
	now := time.Now()
	quietGaps, _ := p.watch.stalls(now.Add(-quietBefore), now)
	quiet := slices.Max(quietGaps)
	res := measureEvent(t, p.r, p.watch, p.reapers, productionHeartbeatTimeout, name, do)
	res.quiet = quiet
	res.lone = p.lone.stalls(res.at, res.at.Add(res.window))
	// Until the controller fences a crashed broker, it stays in every in-sync replica set it was
	// in, and nothing it led or coordinated moves: that much of a crash's cost is Kafka's.
	if at, ok := p.r.kafka.FencedAt(node.ID, res.at); ok && at.Before(res.at.Add(res.allBack)) {
		res.brokerFenced = at.Sub(res.at)
	}
	p.results = append(p.results, res)
	t.Log(res)
	for _, rp := range p.reapers {
		select {
		case <-rp.done:
			// A reaper stops only on an error retrying cannot cure; a cluster event is not one.
			t.Fatalf("%s: reaper %s exited (code %d); its log's end follows", name, rp.name, rp.cmd.ProcessState.ExitCode())
		default:
		}
	}
	if !node.Running() {
		if err := node.Start(); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.r.kafka.WaitReady(2 * time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := p.r.kafka.WaitInSync(3 * time.Minute); err != nil {
		t.Fatal(err)
	}
	p.r.waitProgress(1000, time.Minute)
	p.calm = time.Now()
	return res
}

// finish checks every record and reports the scenario's figures.
func (p *production) finish(scenario string) {
	t := p.t
	t.Helper()
	report := p.r.finish(3 * time.Minute)
	p.r.checkLossesLogged(p.reapers...)
	var lines []string
	for _, res := range p.results {
		// Every record has arrived now: the latency of those written while the event lasted.
		res.p99, res.most, res.written = p.r.v.LatencyOfWritten(res.at, res.at.Add(res.allBack))
		lines = append(lines, res.String())
	}
	figure(t, scenario, "%s; %s; latency p99 %v; records %d, duplicates %d, lost %d, reversals %d",
		p.settings(), strings.Join(lines, "; "), report.P99.Round(time.Millisecond), report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// roles is what each node coordinates for a rig: its groups and its shards' transactional IDs.
type roles struct {
	groups map[int][]string // node ID -> the groups it coordinates
	txns   map[int][]int    // node ID -> the shards whose transactional IDs it coordinates
	nodes  []*kafkacluster.Node
}

func coordinatorRoles(t *testing.T, r *rig, shards int) roles {
	t.Helper()
	ro := roles{groups: map[int][]string{}, txns: map[int][]int{}, nodes: r.kafka.Nodes()}
	for _, g := range []string{r.group, r.group + goharvest.NoteGroupSuffix} {
		n := coordinatorOf(t, r, kafkacluster.GroupCoordinator, g)
		ro.groups[n.ID] = append(ro.groups[n.ID], g)
	}
	for s := range shards {
		n := coordinatorOf(t, r, kafkacluster.TransactionCoordinator, goharvest.TransactionalID(r.group, s, shards))
		ro.txns[n.ID] = append(ro.txns[n.ID], s)
	}
	return ro
}

func coordinatorOf(t *testing.T, r *rig, kind int8, key string) *kafkacluster.Node {
	t.Helper()
	n, err := r.kafka.Coordinator(kind, key)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// bystander returns the node that coordinates neither group and the fewest transactional IDs.
// With RF 3 on 3 nodes every node holds a replica of everything; what differs is what it leads.
func (ro roles) bystander() *kafkacluster.Node {
	var best *kafkacluster.Node
	for _, n := range ro.nodes {
		if len(ro.groups[n.ID]) > 0 {
			continue
		}
		if best == nil || len(ro.txns[n.ID]) < len(ro.txns[best.ID]) {
			best = n
		}
	}
	return best
}

// busiestTxn returns the node that coordinates the most shards' transactional IDs.
func (ro roles) busiestTxn() *kafkacluster.Node {
	best := ro.nodes[0]
	for _, n := range ro.nodes {
		if len(ro.txns[n.ID]) > len(ro.txns[best.ID]) {
			best = n
		}
	}
	return best
}

func (ro roles) describe(id int) string {
	return fmt.Sprintf("groups %v, transactional IDs of shards %v", ro.groups[id], ro.txns[id])
}

// eventResult is what one cluster event cost.
type eventResult struct {
	name    string
	lost    int      // shard leaderships lost (revoked or fenced) by the reapers
	fenced  int      // self-fences (no heartbeat back within the timeout)
	changes []string // each loss, for the log
	stalls  []time.Duration
	allBack time.Duration // from the event to when the last shard published after the stall the event began
	took    time.Duration // how long the event itself took (a controlled shutdown takes seconds)
	window  time.Duration // from at, the time in which a stall that began was the event's doing
	quiet   time.Duration // the longest gap between a shard's records in the quietBefore before it
	at      time.Time     // when it began
	// brokerFenced is when, after at, the controller fenced the node (0 if it did not before every
	// shard published again): a crashed node's partitions and coordinators move only then.
	brokerFenced time.Duration

	// The write-to-consumption latency of the records written from at until every shard
	// published again (p99 and the most, of written records), known once every record arrived.
	p99, most time.Duration
	written   int

	// lone describes the lone producers' longest gaps between commits in the window (see
	// loneProducers): what the event cost a transactional producer without the relay.
	lone string
}

func (e eventResult) String() string {
	return fmt.Sprintf("%s (took %v): shard leaderships lost %d (self-fences %d); publishing stalled per shard %v; every shard publishing again after %v; with no fault in the %v before, a shard's longest gap %v",
		e.name, e.took.Round(100*time.Millisecond), e.lost, e.fenced, roundAll(e.stalls), e.allBack.Round(time.Millisecond),
		quietBefore, e.quiet.Round(100*time.Millisecond)) + e.fence() + e.latency() + e.loneStalls()
}

func (e eventResult) loneStalls() string {
	if e.lone == "" {
		return ""
	}
	return fmt.Sprintf("; goharvest's producer alone (franz; no election, Postgres or engine; a transaction to every partition every %v) stalled %s", loneCadence, e.lone)
}

func (e eventResult) fence() string {
	if e.brokerFenced == 0 {
		return ""
	}
	return fmt.Sprintf("; the controller fenced the node after %v, and every shard published again %v after that",
		e.brokerFenced.Round(time.Millisecond), (e.allBack - e.brokerFenced).Round(time.Millisecond))
}

func (e eventResult) latency() string {
	if e.written == 0 {
		return ""
	}
	return fmt.Sprintf("; latency of the %d messages (repeats included) written until then p99 %v, max %v", e.written, e.p99.Round(time.Millisecond), e.most.Round(time.Millisecond))
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Millisecond)
	}
	return out
}

// measureEvent runs do and measures what it cost, until every shard publishes again and, after
// that, two heartbeat timeouts more: nothing announces that no further change is coming, and a
// leader fences itself at most one timeout after its last heartbeat was acknowledged, its session ends at
// most two after the coordinator last heard from it.
func measureEvent(t *testing.T, r *rig, w *shardWatch, reapers []*reaper, heartbeatTimeout time.Duration, name string, do func()) eventResult {
	t.Helper()
	t0 := time.Now()
	do()
	took := time.Since(t0)
	// Every transaction spans several partitions, so publishing resumes only once Kafka serves
	// them all again; then each shard must have published since.
	r.waitProgress(2000, 3*time.Minute)
	back := time.Now()
	if !testwait.Until(2*time.Minute, func() bool { return w.allPublishedSince(back) }) {
		t.Fatalf("%s: some shard did not publish again within 2m: last publications %v", name, w.last())
	}
	end := time.Now().Add(2 * heartbeatTimeout)
	time.Sleep(time.Until(end)) // see the comment above
	res := eventResult{name: name, took: took, at: t0}
	// A stall the event caused begins by the time the event is done, or, for a leader that fenced
	// itself, at most one heartbeat timeout later, or when a shard's leadership was lost, which
	// kgo's heartbeat to a crashed group coordinator can do a whole session later. A gap that
	// begins after all those is not the event's doing: Kafka moving partition leadership back to
	// a restarted node minutes later, for one.
	causedBy := took + heartbeatTimeout // after t0
	for _, p := range reapers {
		p.mu.Lock()
		for _, e := range p.history {
			if !e.acquired && e.at.After(t0) && e.at.Before(end) {
				res.lost++
				res.changes = append(res.changes, fmt.Sprintf("%s lost shard %d at +%v", p.name, e.shard, e.at.Sub(t0).Round(time.Millisecond)))
				causedBy = max(causedBy, e.at.Sub(t0)+time.Second)
			}
		}
		for _, f := range p.selfFenced {
			if f.After(t0) && f.Before(end) {
				res.fenced++
				res.changes = append(res.changes, fmt.Sprintf("%s fenced itself at +%v", p.name, f.Sub(t0).Round(time.Millisecond)))
				causedBy = max(causedBy, f.Sub(t0)+time.Second)
			}
		}
		p.mu.Unlock()
	}
	res.window = causedBy
	res.stalls, res.allBack = w.stalls(t0, t0.Add(causedBy))
	return res
}

// waitAllShardsLed waits until the reapers between them lead every shard.
func waitAllShardsLed(t *testing.T, within time.Duration, shards int, ps ...*reaper) {
	t.Helper()
	if !testwait.Until(within, func() bool {
		n := 0
		for _, p := range ps {
			n += len(p.shards())
		}
		return n == shards
	}) {
		t.Fatalf("the reapers did not lead all %d shards within %v", shards, within)
	}
}

// shardWatch records when each shard's records arrive, as a reader of committed records sees it.
type shardWatch struct {
	mu       sync.Mutex
	arrivals [][]time.Time // per shard, the polls that brought records of it
}

func watchShards(t *testing.T, r *rig, shards int) *shardWatch {
	t.Helper()
	// The watch is itself a client of the faulted cluster: a partition's records reach it only
	// once it knows the partition's new leader, and franz-go refreshes metadata at most every 5s by
	// default, which would count as the shards' stall.
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(r.addr, ",")...), kgo.ConsumeTopics(r.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	w := &shardWatch{arrivals: make([][]time.Time, shards)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cl.Close()
		for ctx.Err() == nil {
			fetches := cl.PollFetches(ctx)
			now := time.Now()
			seen := make([]bool, shards)
			fetches.EachRecord(func(rec *kgo.Record) { seen[outbox.Shard(rec.Key, shards)] = true })
			w.mu.Lock()
			for s, ok := range seen {
				if ok {
					w.arrivals[s] = append(w.arrivals[s], now)
				}
			}
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// arrived notes that records of shard s arrived at at.
func (w *shardWatch) arrived(s int, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.arrivals[s] = append(w.arrivals[s], at)
}

func (w *shardWatch) allPublishedSince(at time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.arrivals {
		if len(a) == 0 || !a[len(a)-1].After(at) {
			return false
		}
	}
	return true
}

func (w *shardWatch) last() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for s, a := range w.arrivals {
		if len(a) > 0 {
			out = append(out, fmt.Sprintf("%d: %s", s, a[len(a)-1].Format("15:04:05.000")))
		}
	}
	return out
}

// stalls returns each shard's longest gap between arrivals that ended after from and began before
// to, and how long after from the last of those gaps ended: when every shard published again.
func (w *shardWatch) stalls(from, to time.Time) ([]time.Duration, time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	var stalls []time.Duration
	var allBack time.Duration
	for _, a := range w.arrivals {
		var longest time.Duration
		var endedAt time.Time
		for i := 1; i < len(a); i++ {
			if a[i].After(from) && a[i-1].Before(to) && a[i].Sub(a[i-1]) > longest {
				longest, endedAt = a[i].Sub(a[i-1]), a[i]
			}
		}
		stalls = append(stalls, longest)
		allBack = max(allBack, endedAt.Sub(from))
	}
	return stalls, allBack
}

// TestSoakProduction is make soak's second half: the production rig above under broker faults
// for the soak's duration, each a node chosen at random (SOAK_SEED replays the choices) that is
// stopped as an operator stops it (SIGTERM) or crashes (SIGKILL), then started again once every
// shard publishes. Every record must arrive, in order per key; the figures say what each event
// cost, as the scenarios above do for one.
func TestSoakProduction(t *testing.T) {
	if os.Getenv("GOHARVEST_SOAK") == "" {
		t.Skip("make soak")
	}
	duration, seed := soakSettings(t)
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	t.Logf("production soak for %v, SOAK_SEED=%d", duration, seed)
	p := startProduction(t, nil)
	end := time.Now().Add(duration)
	for i := 0; time.Now().Before(end); i++ {
		nodes := p.r.kafka.Nodes()
		n := nodes[rng.IntN(len(nodes))]
		// Coordinators move as nodes stop, so each event names what its node holds now.
		roles := coordinatorRoles(t, p.r, productionShards).describe(n.ID)
		if rng.IntN(2) == 0 {
			p.event(fmt.Sprintf("%d: SIGTERM of node %d (%s)", i, n.ID, roles), n, func() { n.Terminate(2 * time.Minute) })
		} else {
			p.event(fmt.Sprintf("%d: SIGKILL of node %d (%s)", i, n.ID, roles), n, n.Kill)
		}
	}
	p.finish(fmt.Sprintf("production soak (SOAK_SEED=%d, %v)", seed, duration))
}

// The figures name the rate and any broker setting the rig ran at, so that a tuned run cannot
// be read as one at Kafka's defaults.
func TestProductionSettingsNameWhatTheRigRanAt(t *testing.T) {
	t.Setenv("GOHARVEST_PRODUCTION_RATE", "100")
	t.Setenv("GOHARVEST_PRODUCTION_BROKER", " replica.fetch.backoff.ms = 100,num.replica.fetchers=2")
	rate, broker := productionSettings(t)
	p := &production{rate: rate, broker: broker}
	want := "3 nodes at Kafka's default timings but num.replica.fetchers=2, replica.fetch.backoff.ms=100, 3 reapers, 8 shards, heartbeatTimeout 5s, 100 records/s"
	if got := p.settings(); got != want {
		t.Errorf("settings() = %q, want %q", got, want)
	}
	t.Setenv("GOHARVEST_PRODUCTION_RATE", "")
	t.Setenv("GOHARVEST_PRODUCTION_BROKER", "")
	rate, broker = productionSettings(t)
	p = &production{rate: rate, broker: broker}
	if got, want := p.settings(), "3 nodes at Kafka's default timings, 3 reapers, 8 shards, heartbeatTimeout 5s, 800 records/s"; got != want {
		t.Errorf("settings() unset = %q, want %q", got, want)
	}
}

// fenceWatch polls every surviving node's metadata for the moment the controller's fence of a
// crashed node reached it: the node gone from the brokers Kafka lists and leading no partition of
// the rig's topic, which is what clients see.
type fenceWatch struct {
	done chan struct{}
	// at is when the first poll that found the node fenced was sent, and before when the last
	// that found it not was; zero if none did.
	at, before time.Time
	partitions int // the rig's topic's, as the metadata lists them
	err        error
}

// fencePoll is how often fenceWatch asks: the fence's instant is known to within it.
const fencePoll = 10 * time.Millisecond

func watchFence(t *testing.T, r *rig, dead int) *fenceWatch {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(r.addr, ",")...))
	if err != nil {
		t.Fatal(err)
	}
	var others []int
	for _, n := range r.kafka.Nodes() {
		if n.ID != dead {
			others = append(others, n.ID)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	// A metadata request through the client tells it the nodes' addresses, which asking each
	// node by its ID needs.
	if _, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl); err != nil {
		cancel()
		cl.Close()
		t.Fatal(err)
	}
	f := &fenceWatch{done: make(chan struct{})}
	go func() {
		defer close(f.done)
		defer cl.Close()
		tick := time.NewTicker(fencePoll)
		defer tick.Stop()
		for {
			for _, id := range others {
				sent := time.Now()
				req := kmsg.NewPtrMetadataRequest()
				topic := kmsg.NewMetadataRequestTopic()
				topic.Topic = kmsg.StringPtr(r.topic)
				req.Topics = append(req.Topics, topic)
				resp, err := req.RequestWith(ctx, cl.Broker(id))
				if err != nil {
					continue // that node is down too, or busy: ask the others
				}
				if !fencedIn(resp, int32(dead)) {
					f.before = sent
					continue
				}
				f.at = sent
				for _, topic := range resp.Topics {
					f.partitions += len(topic.Partitions)
				}
				return
			}
			select {
			case <-ctx.Done():
				f.err = fmt.Errorf("node %d still in the metadata: %w", dead, ctx.Err())
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-f.done })
	return f
}

// fencedIn reports whether a metadata response lists the node neither as a broker nor as any
// partition's leader.
func fencedIn(resp *kmsg.MetadataResponse, node int32) bool {
	for _, b := range resp.Brokers {
		if b.NodeID == node {
			return false
		}
	}
	for _, topic := range resp.Topics {
		if topic.ErrorCode != 0 {
			return false
		}
		for _, part := range topic.Partitions {
			if part.Leader == node {
				return false
			}
		}
	}
	return true
}

// wait returns when the node was fenced.
func (f *fenceWatch) wait(t *testing.T) time.Time {
	t.Helper()
	<-f.done
	if f.err != nil {
		t.Fatal(f.err)
	}
	return f.at
}

// controllerFence is when the controller's log says it fenced the node, for comparison.
func controllerFence(p *production, id int, after time.Time) string {
	if at, ok := p.r.kafka.FencedAt(id, after); ok {
		return at.Format("15:04:05.000")
	}
	return "(not found)"
}

// commitWatch reads the rig's topic from its end with its transactions' markers, and keeps the
// instants at which each shard's transactions committed: a commit marker's timestamp is when the
// partition's leader wrote it, the moment the transaction's records became visible to readers of
// committed records. A shard's producer is known by the producer ID of its records.
type commitWatch struct {
	shards int
	mu     sync.Mutex
	shard  map[int64]int         // producer ID -> shard
	marks  map[int64][]time.Time // producer ID -> its commit markers' timestamps
	read   map[int32]time.Time   // partition -> the newest timestamp read from it
}

func watchCommits(t *testing.T, r *rig, shards int) *commitWatch {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(r.addr, ",")...), kgo.ConsumeTopics(r.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()), kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(), kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	w := &commitWatch{shards: shards, shard: map[int64]int{}, marks: map[int64][]time.Time{}, read: map[int32]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cl.Close()
		for ctx.Err() == nil {
			fetches := cl.PollFetches(ctx)
			w.mu.Lock()
			fetches.EachRecord(func(rec *kgo.Record) {
				if rec.Timestamp.After(w.read[rec.Partition]) {
					w.read[rec.Partition] = rec.Timestamp
				}
				if !rec.Attrs.IsControl() {
					w.shard[rec.ProducerID] = outbox.Shard(rec.Key, shards)
					return
				}
				var key kmsg.ControlRecordKey
				if key.ReadFrom(rec.Key) == nil && key.Type == kmsg.ControlRecordKeyTypeCommit {
					w.marks[rec.ProducerID] = append(w.marks[rec.ProducerID], rec.Timestamp)
				}
			})
			w.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

// firstAfter returns, per shard, how long after at its first commit came. It waits for every
// shard's, and until every partition has been read past the last of them: the watch reads a
// partition whose leader moved only once it learns of the new one, and that partition may hold
// a shard's first commit.
func (w *commitWatch) firstAfter(t *testing.T, at time.Time, partitions int) []time.Duration {
	t.Helper()
	var back []time.Duration
	if !testwait.Until(time.Minute, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		back = make([]time.Duration, w.shards)
		for pid, marks := range w.marks {
			s, ok := w.shard[pid]
			if !ok {
				continue
			}
			for _, m := range marks {
				if m.After(at) && (back[s] == 0 || m.Sub(at) < back[s]) {
					back[s] = m.Sub(at)
				}
			}
		}
		if slices.Contains(back, 0) || len(w.read) < partitions {
			return false
		}
		for _, ts := range w.read {
			if !ts.After(at.Add(slices.Max(back))) {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("not every shard committed within a minute of %s: %v", at.Format("15:04:05.000"), back)
	}
	return back
}
