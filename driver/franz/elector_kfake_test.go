package franz_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// The election keeps the elector contract on kfake too. Apache Kafka (TestFranzElectorContract)
// is what counts; this run needs neither Java nor cgo.
func TestFranzElectorContractOnKfake(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	for _, c := range []struct {
		partitions int
		steadily   bool
	}{{1, false}, {2, false}, {1, true}, {2, true}} {
		partitions := c.partitions
		name := fmt.Sprint(partitions)
		if c.steadily {
			name += "/steadily"
		}
		t.Run(name, func(t *testing.T) {
			drivertest.RunElector(t, func(t *testing.T) drivertest.Election {
				group := fmt.Sprintf("kfake-elector-%d-%d", partitions, kfakeElections.Add(1))
				var names atomic.Int32
				return drivertest.Election{
					Join: func(t *testing.T, lost func([]int32)) driver.Elector {
						return joinKfake(t, addr, group, fmt.Sprintf("c%d", names.Add(1)), partitions, time.Second, lost)
					},
					Partitions:    partitions,
					PulseEvery:    50 * time.Millisecond,
					Within:        30 * time.Second,
					PulseSteadily: c.steadily,
				}
			})
		})
	}
}

var kfakeElections atomic.Int32

// startKfake starts a one-broker kfake cluster with opts, closed when the test ends.
func startKfake(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	cluster, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cluster.Close)
	return cluster
}

func joinKfake(t *testing.T, addr, group, name string, partitions int, heartbeatTimeout time.Duration, lost func([]int32)) driver.Elector {
	t.Helper()
	e, err := franz.New(franz.Config{SeedBrokers: []string{addr}}).NewElector(driver.ElectorConfig{
		LeaderTopic:      group + ".leader",
		LeaderGroupID:    group,
		Partitions:       partitions,
		Name:             name,
		HeartbeatTimeout: heartbeatTimeout,
		MinPollInterval:  heartbeatTimeout / 20,
		Barrier:          lost,
		Logger:           slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// silenceHeartbeats has cluster answer none of the heartbeats of the contender whose name the
// returned value holds ("" for none): their produce requests are taken and never answered.
func silenceHeartbeats(cluster *kfake.Cluster) *atomic.Value {
	var silenced atomic.Value
	silenced.Store("")
	cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		name := silenced.Load().(string)
		if name == "" {
			return nil, nil, false
		}
		for _, topic := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range topic.Partitions {
				if bytes.Contains(p.Records, []byte(name+"|")) {
					return nil, nil, true // handled, with no answer: the client waits in vain
				}
			}
		}
		return nil, nil, false
	})
	return &silenced
}

// refusals has a kfake cluster answer every request of one key with an error code until a
// moment the test moves, and records when it refused.
type refusals struct {
	until atomic.Int64 // UnixNano; requests before it are refused
	seen  atomic.Int32 // requests of the key, refused or not
	mu    sync.Mutex
	at    []time.Time
}

// refuse has cluster answer key's requests with code while r.until is in the future. key is
// JoinGroup, Heartbeat or LeaveGroup.
func refuse(cluster *kfake.Cluster, key kmsg.Key, code int16) *refusals {
	r := &refusals{}
	cluster.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		r.seen.Add(1)
		if time.Now().UnixNano() >= r.until.Load() {
			return nil, nil, false
		}
		r.mu.Lock()
		r.at = append(r.at, time.Now())
		r.mu.Unlock()
		switch resp := req.ResponseKind().(type) {
		case *kmsg.JoinGroupResponse:
			resp.ErrorCode = code
			return resp, nil, true
		case *kmsg.HeartbeatResponse:
			resp.ErrorCode = code
			return resp, nil, true
		case *kmsg.LeaveGroupResponse:
			resp.ErrorCode = code
			return resp, nil, true
		default:
			panic(fmt.Sprintf("refuse: no error code set for %T", resp))
		}
	})
	return r
}

// refuseUntil refuses the requests made before t.
func (r *refusals) refuseUntil(t time.Time) { r.until.Store(t.UnixNano()) }

// times returns when the requests were refused.
func (r *refusals) times() []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.at)
}

// pulsing pulses e every interval until the test ends, then closes it, resting as long as e asks
// and waking when it says, as the engine's loop does when its shards are at rest (see
// driver.RestingElector). A Pulse error fails the test.
func pulsing(t *testing.T, e driver.Elector, interval time.Duration) {
	stop, done := make(chan struct{}), make(chan struct{})
	resting := e.(driver.RestingElector)
	go func() {
		defer close(done)
		for {
			if _, err := e.Pulse(context.Background()); err != nil {
				t.Errorf("Pulse: %v", err)
				return
			}
			select {
			case <-stop:
				return
			case <-resting.Wake():
			case <-time.After(max(interval, resting.Rest())):
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		<-done
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := e.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
}

// A leader whose heartbeats go unanswered, while it still reaches the group's coordinator, steps
// down within the heartbeat timeout: it stops leading, runs its Barrier, and leaves the group, and
// only after that Barrier has returned does the other contender lead. Kafka answering no
// heartbeat of one contender is a fault only a fake can cause.
func TestLeaderWhoseHeartbeatsGoUnansweredStepsDown(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	const heartbeatTimeout = time.Second
	interval := heartbeatTimeout / 20

	silenced := silenceHeartbeats(cluster)

	var mu sync.Mutex
	var barriers []string // "name@elapsed"
	start := time.Now()
	names := []string{"contender-a", "contender-b"}
	electors := map[string]driver.Elector{}
	// The first Barrier of each: a contender that fenced itself may be given the partition again
	// when it rejoins, and fence itself again, while Kafka still answers none of its heartbeats.
	barrierDone := map[string]time.Time{}
	for _, name := range names {
		e := joinKfake(t, addr, "silenced", name, 1, heartbeatTimeout, func(ps []int32) {
			mu.Lock()
			defer mu.Unlock()
			barriers = append(barriers, fmt.Sprintf("%s%v@%v", name, ps, time.Since(start).Round(time.Millisecond)))
			if _, ok := barrierDone[name]; !ok {
				barrierDone[name] = time.Now()
			}
		})
		electors[name] = e
		pulsing(t, e, interval)
	}
	leader := func() string {
		var who []string
		for _, name := range names {
			if electors[name].Leading() {
				who = append(who, name)
			}
		}
		if len(who) > 1 {
			t.Fatalf("%v lead at once", who)
		}
		if len(who) == 0 {
			return ""
		}
		return who[0]
	}
	// Polled every 5ms: leader fails the test the moment both lead.
	waitFor := func(what string, within time.Duration, cond func() bool) {
		t.Helper()
		if !testwait.UntilEvery(within, 5*time.Millisecond, cond) {
			t.Fatalf("not within %v: %s", within, what)
		}
	}
	var first string
	waitFor("a leader", 30*time.Second, func() bool { first = leader(); return first != "" })
	second := names[0]
	if first == names[0] {
		second = names[1]
	}

	silenced.Store(first)
	cut := time.Now()
	waitFor(first+" stops leading", heartbeatTimeout+time.Second, func() bool { return !electors[first].Leading() })
	t.Logf("%s stopped leading %v after its heartbeats went unanswered", first, time.Since(cut).Round(time.Millisecond))
	waitFor(second+" leads", 30*time.Second, func() bool { return leader() == second })
	took := time.Since(cut)

	mu.Lock()
	fenced, ok := barrierDone[first]
	log := slices.Clone(barriers)
	mu.Unlock()
	t.Logf("barriers: %v; %s leads %v after the cut", log, second, took.Round(time.Millisecond))
	if !ok {
		t.Fatalf("%s's Barrier did not run before %s led", first, second)
	}
	if fenced.Sub(cut) > heartbeatTimeout+time.Second {
		t.Errorf("%s's Barrier ran %v after the cut, later than the heartbeat timeout %v allows", first, fenced.Sub(cut), heartbeatTimeout)
	}

	// Heard again, the first contender rejoins as a follower: the partition stays with the second.
	silenced.Store("")
	var who string
	if !testwait.Throughout(2*heartbeatTimeout, interval, func() bool { who = leader(); return who == second }) {
		t.Fatalf("after the first contender was heard again, %q leads; want %s to keep leading", who, second)
	}
}

// A broker that accepts connections and never answers leaves every request of the election
// waiting: each Pulse must still return within its bound, the contender must not lead, and Close
// must return.
func TestFranzElectorAgainstSilentKafka(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }() // reads every request, answers none
		}
	}()
	const heartbeatTimeout = time.Second
	e := joinKfake(t, ln.Addr().String(), "silent", "c0", 1, heartbeatTimeout, nil)
	// A Pulse waits at most a heartbeat timeout for the leader topic, and a millisecond for the
	// group.
	bound := heartbeatTimeout + time.Second
	for range 3 {
		start := time.Now()
		leads, err := e.Pulse(t.Context())
		if took := time.Since(start); took > bound {
			t.Fatalf("Pulse took %v against a silent broker, more than %v", took, bound)
		}
		if err != nil || leads {
			t.Fatalf("Pulse against a silent broker returned leads=%v, err=%v; want a follower riding out the outage", leads, err)
		}
	}
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*heartbeatTimeout)
		defer cancel()
		closed <- e.Close(ctx)
	}()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return against a silent broker")
	}
}

// A heartbeat timeout whose session (twice it) the broker refuses is an error that names the
// heartbeat timeout, not an outage ridden out for ever: kfake, as Apache Kafka, allows sessions
// of 6s or more by default, and a second's heartbeat timeout asks for 2s.
func TestFranzElectorRefusedSessionIsAnError(t *testing.T) {
	cluster := startKfake(t)
	e := joinKfake(t, cluster.ListenAddrs()[0], "short", "c0", 1, time.Second, nil)
	defer e.Close(context.Background())
	var err error
	if !testwait.UntilEvery(30*time.Second, 50*time.Millisecond, func() bool { _, err = e.Pulse(t.Context()); return err != nil }) {
		t.Fatal("Pulse returned no error within 30s for a session the broker refuses")
	}
	if !strings.Contains(err.Error(), "heartbeat timeout") || !strings.Contains(err.Error(), "group.min.session.timeout.ms") {
		t.Errorf("Pulse: %v; want an error naming the heartbeat timeout and group.min.session.timeout.ms", err)
	}
}

// A contender whose loop stops pulsing keeps no partition from the others: kgo keeps a member in
// the group from a goroutine of its own, so after two heartbeat timeouts without a Pulse the
// contender leaves the group (as librdkafka does after max.poll.interval.ms), and another leads.
// When its loop resumes, it runs its Barrier and stays a follower. The group is steady when the
// loop stalls: a rebalance would evict the stalled member anyway, its callbacks unserved.
func TestFranzElectorWhoseLoopStallsLetsOthersLead(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	const heartbeatTimeout = time.Second
	interval := heartbeatTimeout / 20
	type contender struct {
		driver.Elector
		paused   atomic.Bool
		barriers atomic.Int32
	}
	var cs []*contender
	for _, name := range []string{"c0", "c1"} {
		c := &contender{}
		c.Elector = joinKfake(t, addr, "stall", name, 1, heartbeatTimeout, func([]int32) { c.barriers.Add(1) })
		cs = append(cs, c)
		stop, done := make(chan struct{}), make(chan struct{})
		go func() {
			defer close(done)
			for {
				if !c.paused.Load() {
					if _, err := c.Pulse(context.Background()); err != nil {
						t.Errorf("%s: Pulse: %v", name, err)
						return
					}
				}
				select {
				case <-stop:
					return
				case <-time.After(interval):
				}
			}
		}()
		t.Cleanup(func() { close(stop); <-done; c.Close(context.Background()) })
	}
	var stalled, other *contender
	if !testwait.UntilEvery(30*time.Second, interval, func() bool {
		for i, c := range cs {
			if c.Leading() {
				stalled, other = c, cs[1-i]
			}
		}
		return stalled != nil
	}) {
		t.Fatal("no contender led within 30s")
	}
	// A steady stretch, so that no rebalance is under way when the loop stalls.
	if !testwait.Throughout(2*heartbeatTimeout, interval, stalled.Leading) {
		t.Fatal("the leader lost its leadership without a fault")
	}
	stalled.paused.Store(true)
	stop := time.Now()
	if !testwait.UntilEvery(2*heartbeatTimeout+20*time.Second, interval, func() bool {
		if stalled.Leading() && time.Since(stop) > heartbeatTimeout+interval {
			t.Fatalf("a contender whose loop stalled reads as leading %v later, past the heartbeat timeout", time.Since(stop))
		}
		return other.Leading()
	}) {
		t.Fatalf("the other contender did not lead within %v of the first one's loop stalling", time.Since(stop))
	}
	if stalled.Leading() {
		t.Fatal("both contenders lead")
	}
	took := time.Since(stop)
	t.Logf("the other contender led %v after the first one's loop stalled", took.Round(time.Millisecond))
	if took < 2*heartbeatTimeout-100*time.Millisecond {
		t.Errorf("the other contender led %v after the stall, before the two heartbeat timeouts the stalled one is allowed", took)
	}
	// The loop resumes: the Barrier runs, and the partition stays with the other.
	stalled.paused.Store(false)
	if !testwait.Throughout(2*heartbeatTimeout, interval, func() bool { return !stalled.Leading() }) {
		t.Fatal("the contender whose loop stalled leads again while the other does")
	}
	if stalled.barriers.Load() == 0 {
		t.Error("the contender whose loop stalled never ran its Barrier for the partition it lost")
	}
}

// A leader can rest between its heartbeats, at most a tenth of the heartbeat timeout, and a
// revocation cuts its rest short (Wake, and no rest while a callback waits): it is served at once,
// and the leader keeps leading the partition it keeps, rather than fencing itself.
func TestFranzElectorRestsBetweenHeartbeatsAndWakesForTheGroup(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	const heartbeatTimeout = 2 * time.Second
	group := fmt.Sprintf("kfake-rest-%d", kfakeElections.Add(1))
	type barrier struct {
		partitions []int32
		fenced     bool
	}
	barriers := make(chan barrier, 10)
	var first driver.Elector
	first = joinKfake(t, addr, group, "c1", 2, heartbeatTimeout, func(ps []int32) {
		barriers <- barrier{partitions: ps, fenced: first.Fenced()}
	})
	resting := first.(driver.RestingElector)
	if rest := resting.Rest(); rest != 0 {
		t.Fatalf("Rest %v before joining the group; want 0", rest)
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(first.Partitions()) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the lone contender did not lead both partitions within 30s")
		}
		if _, err := first.Pulse(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case <-resting.Wake():
		case <-time.After(10 * time.Millisecond):
		}
	}
	// Each Pulse sends the heartbeat that is due, so the Rest asked right after it is the time to
	// the next; asked later, it may rightly be 0 (a heartbeat due since).
	for range 5 {
		if _, err := first.Pulse(t.Context()); err != nil {
			t.Fatal(err)
		}
		rest := resting.Rest()
		if rest <= 0 || rest > heartbeatTimeout/10 {
			t.Fatalf("Rest %v right after a Pulse while leading; want within (0, %v]", rest, heartbeatTimeout/10)
		}
		select { // as the engine rests
		case <-resting.Wake():
		case <-time.After(rest):
		}
	}
	if !first.Leading() {
		t.Fatal("stopped leading while resting between heartbeats")
	}

	// From here the first contender is pulsed as the engine pulses it at rest, noting whether each
	// Pulse was woken. A second joins, and the group takes one partition back from the first.
	second := joinKfake(t, addr, group, "c2", 2, heartbeatTimeout, func([]int32) {})
	pulsing(t, second, 10*time.Millisecond)
	for {
		if time.Now().After(deadline.Add(30 * time.Second)) {
			t.Fatal("the first contender's Barrier did not run within 30s of a second contender joining")
		}
		// Prompt: the Pulse that serves the revocation was woken, or came without a rest because
		// the revocation was waiting (a Pulse it woke may come too early to take it), and never
		// after a rest that nothing cut short.
		rest, woken := resting.Rest(), false
		select {
		case <-resting.Wake():
			woken = true
		case <-time.After(rest):
			select {
			case <-resting.Wake():
				woken = true
			default:
			}
		}
		if _, err := first.Pulse(t.Context()); err != nil {
			t.Fatal(err)
		}
		select {
		case b := <-barriers:
			if b.fenced || len(b.partitions) != 1 || (!woken && rest > 0) {
				t.Fatalf("the first contender's Barrier ran for %v, fenced %v, in a Pulse woken %v after a rest of %v; "+
					"want one partition revoked while it led, in a Pulse the revocation woke or kept from resting",
					b.partitions, b.fenced, woken, rest)
			}
		default:
			continue
		}
		break
	}
	pulsing(t, first, 10*time.Millisecond)
	if !testwait.Until(30*time.Second, func() bool { return len(first.Partitions()) == 1 && len(second.Partitions()) == 1 }) {
		t.Fatalf("leading %v and %v; want one partition each", first.Partitions(), second.Partitions())
	}
}

// A leader's Ping asks Kafka nothing: its acknowledged heartbeats say that the cluster answers.
// A contender that leads nothing asks for the leader topic's metadata each time.
func TestFranzElectorPingAsksKafkaOnlyWhenNotLeading(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	var metadata atomic.Int32
	cluster.ControlKey(int16(kmsg.Metadata), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		metadata.Add(1)
		return nil, nil, false
	})
	addr := cluster.ListenAddrs()[0]
	group := fmt.Sprintf("kfake-ping-%d", kfakeElections.Add(1))
	const heartbeatTimeout = 2 * time.Second
	leader := joinKfake(t, addr, group, "c1", 1, heartbeatTimeout, func([]int32) {})
	pulsing(t, leader, 10*time.Millisecond)
	if !testwait.Until(30*time.Second, leader.Leading) {
		t.Fatal("no leader within 30s")
	}
	standby := joinKfake(t, addr, group, "c2", 1, heartbeatTimeout, func([]int32) {})
	pulsing(t, standby, 10*time.Millisecond)

	const pings = 20
	for _, c := range []struct {
		name    string
		e       driver.Elector
		leading bool
	}{{"the leader", leader, true}, {"the standby", standby, false}} {
		before := metadata.Load()
		for range pings {
			if err := c.e.(driver.Pinger).Ping(t.Context()); err != nil {
				t.Fatalf("%s: Ping: %v", c.name, err)
			}
		}
		// The clients' own metadata refreshes (every heartbeat timeout) add a few.
		asked := metadata.Load() - before
		switch {
		case c.e.Leading() != c.leading:
			t.Fatalf("%s: leading %v during the pings", c.name, c.e.Leading())
		case c.leading && asked > 3:
			t.Errorf("%s: %d metadata requests over %d pings; want none of its own", c.name, asked, pings)
		case !c.leading && asked < pings:
			t.Errorf("%s: %d metadata requests over %d pings; want one each", c.name, asked, pings)
		}
	}
}

// While the group's coordinator is away, a contender asks to join again at most about
// DefaultElectionRetryBackoffMax apart, however long it has been refused, so that it joins soon
// after a coordinator serves again. A group completes its rebalance only once its slowest member
// has joined: when the election group's coordinator crashed (int.TestGroupCoordinatorCrash), a
// member that had been refused since the crash asked again a second after the new coordinator
// served, at the producers' backoff, and held back every shard of the group that long.
func TestFranzElectorAsksToJoinPromptlyWhileTheCoordinatorIsAway(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]

	joins := refuse(cluster, kmsg.JoinGroup, kerr.CoordinatorNotAvailable.Code)
	joins.refuseUntil(time.Now().Add(time.Hour)) // until the test says otherwise

	// A session (6s) longer than the refusals, so that one JoinGroup's tries, and its backoff,
	// last through them: from 10ms doubling, the producers' backoff reaches its most, a second,
	// after 1.3s.
	const heartbeatTimeout = 3 * time.Second
	e := joinKfake(t, addr, "coordinator-away", "contender", 1, heartbeatTimeout, func([]int32) {})
	pulsing(t, e, heartbeatTimeout/20)

	const away = 4 * time.Second
	if !testwait.Until(30*time.Second, func() bool {
		refused := joins.times()
		return len(refused) > 1 && refused[len(refused)-1].Sub(refused[0]) >= away
	}) {
		t.Fatalf("the contender did not ask to join for %v", away)
	}
	back := time.Now()
	joins.refuseUntil(back)
	if !testwait.Until(30*time.Second, e.Leading) {
		t.Fatal("the contender did not lead within 30s of the coordinator serving again")
	}
	led := time.Since(back)

	refused := joins.times()
	var gaps []time.Duration
	for i := 1; i < len(refused); i++ {
		gaps = append(gaps, refused[i].Sub(refused[i-1]))
	}
	longest := slices.Max(gaps)
	t.Logf("refused %d times over %v, the longest gap %v; led %v after the coordinator served again",
		len(refused), refused[len(refused)-1].Sub(refused[0]).Round(time.Millisecond), longest.Round(time.Millisecond), led.Round(time.Millisecond))
	// A wait is at most DefaultElectionRetryBackoffMax (jitter comes before the cap); the rest of
	// the slack is for a busy machine. At the producers' most, the waits reach a second.
	if limit := 600 * time.Millisecond; longest > limit {
		t.Errorf("while the coordinator was away, the contender once waited %v before asking to join again; want at most %v",
			longest.Round(time.Millisecond), limit)
	}
}

// A leader that fences itself leaves the group so that another contender is given its
// partitions. When that leave is lost (the group's coordinator crashed, and kgo gave up asking),
// the coordinator that takes over keeps the old membership for a whole session and the group's
// rebalance waits for it: the contender asks the group to let the old membership go until it is
// heard. Here Kafka answers no heartbeat of the leader, and fails the leader's first leaves.
func TestFencedLeaderWhoseLeaveIsLostLeavesAgain(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	const heartbeatTimeout = 2 * time.Second // a session of 4s
	interval := heartbeatTimeout / 20

	silenced := silenceHeartbeats(cluster)
	// Leaves fail with an error kgo does not retry, as a leave that asks the crashed
	// coordinator, twice, does.
	leaves := refuse(cluster, kmsg.LeaveGroup, kerr.UnknownServerError.Code)

	// The leader joins first, and its successor's name sorts first: once the group has both of
	// them and no owner for the partition (the leader's old membership gone), the balancer
	// gives it to the successor, not to the fenced leader's new membership.
	const first, second = "z-leader", "a-successor"
	var fencedAt atomic.Int64
	electors := map[string]driver.Elector{}
	for _, name := range []string{first, second} {
		e := joinKfake(t, addr, "leave-lost", name, 1, heartbeatTimeout, func([]int32) {
			if name == silenced.Load().(string) {
				fencedAt.CompareAndSwap(0, time.Now().UnixNano())
			}
		})
		electors[name] = e
		pulsing(t, e, interval)
		if name == first && !testwait.Until(30*time.Second, e.Leading) {
			t.Fatalf("%s did not lead within 30s", first)
		}
	}

	const refusing = time.Second
	refusedUntil := time.Now().Add(heartbeatTimeout + refusing)
	leaves.refuseUntil(refusedUntil)
	silenced.Store(first)
	if !testwait.Until(30*time.Second, electors[second].Leading) {
		t.Fatalf("%s did not lead within 30s of %s's heartbeats going unanswered", second, first)
	}
	led := time.Now()
	fenced := time.Unix(0, fencedAt.Load())
	if fencedAt.Load() == 0 {
		t.Fatalf("%s led while %s had not fenced itself", second, first)
	}
	refused := len(leaves.times())
	t.Logf("%s fenced itself; its leaves were refused %d times (of %d) until %v after that; %s led %v after the fence",
		first, refused, leaves.seen.Load(), refusedUntil.Sub(fenced).Round(time.Millisecond), second, led.Sub(fenced).Round(time.Millisecond))
	if refused == 0 {
		t.Fatal("no leave was refused: the test did not lose the fenced leader's leave")
	}
	// Had the old membership stayed, the group would have waited for its session (twice the
	// heartbeat timeout from its last group heartbeat, about the fence) before the rebalance.
	if wait := led.Sub(refusedUntil); wait > heartbeatTimeout {
		t.Errorf("%s led %v after the group would hear a leave again; want within the heartbeat timeout (%v): the fenced leader's old membership was kept until its session ran out",
			second, wait.Round(time.Millisecond), heartbeatTimeout)
	}
}

// A member keeps asking for its group heartbeat for the session (twice the heartbeat timeout),
// however short its waits between tries: kgo gives up on a request after 20 tries whatever the
// time, which at the election's 250ms waits would be four seconds into a coordinator's move,
// well before Kafka fences a crashed broker (9s by default), and the member would lose its
// partitions when its session could have outlasted the move. Here the coordinator answers no
// heartbeat for three quarters of a session (the fake still counts the member's session from its
// last heartbeat heard), and the leader must keep its partition throughout.
func TestFranzElectorHeartbeatRetriesForTheSession(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	const heartbeatTimeout = 4 * time.Second // a session of 8s
	heartbeats := refuse(cluster, kmsg.Heartbeat, kerr.CoordinatorNotAvailable.Code)
	var barriers atomic.Int32
	e := joinKfake(t, addr, "coordinator-moving", "contender", 1, heartbeatTimeout, func([]int32) { barriers.Add(1) })
	pulsing(t, e, heartbeatTimeout/20)
	if !testwait.Until(30*time.Second, e.Leading) {
		t.Fatal("the contender did not lead within 30s")
	}
	const refusing = 6 * time.Second
	heartbeats.refuseUntil(time.Now().Add(refusing))
	// Past the refusals and a few heartbeat intervals more, for the heartbeat to be heard again.
	if !testwait.Throughout(refusing+heartbeatTimeout/2, 50*time.Millisecond, func() bool { return barriers.Load() == 0 }) {
		t.Fatalf("the contender lost its partition %d heartbeats into the coordinator's %v of refusals, within its session (%v)",
			len(heartbeats.times()), refusing, 2*heartbeatTimeout)
	}
	refused := len(heartbeats.times())
	if refused == 0 {
		t.Fatal("no heartbeat was refused: the test did not hold the coordinator back")
	}
	if !e.Leading() {
		t.Error("the contender does not lead after the coordinator answered again")
	}
	t.Logf("%d heartbeats refused over %v; the contender kept its partition", refused, refusing)
}

// The leaders of many outboxes in one process send their heartbeat rounds together, on one grid
// of heartbeatTimeout/10, rather than each on a clock of its own started when it began to lead:
// what an idle outbox costs a reaper is mostly the process's wakes, and leaders that beat
// together share them. Two leaders that began half a round apart are checked at the broker.
func TestFranzLeadersOfOneProcessHeartbeatTogether(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	const heartbeatTimeout = 4 * time.Second // a round every 400ms
	const round = heartbeatTimeout / 10
	var mu sync.Mutex
	arrived := map[string][]time.Time{} // heartbeat produce requests by contender
	cluster.ControlKey(int16(kmsg.Produce), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		for _, topic := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range topic.Partitions {
				for _, name := range []string{"cx0", "cx1"} { // "x": no hex tenure holds these
					if bytes.Contains(p.Records, []byte(name+"|")) {
						arrived[name] = append(arrived[name], now)
					}
				}
			}
		}
		return nil, nil, false
	})
	for i := range 2 {
		group := fmt.Sprintf("kfake-together-%d", kfakeElections.Add(1))
		e := joinKfake(t, addr, group, fmt.Sprintf("cx%d", i), 1, heartbeatTimeout, func([]int32) {})
		pulsing(t, e, 5*time.Millisecond)
		if !testwait.Until(30*time.Second, e.Leading) {
			t.Fatalf("contender %d did not lead within 30s", i)
		}
		// The second begins to lead half a round after the first, and a join's length more: a
		// clock of its own would keep it well off the first's rounds.
		time.Sleep(round / 2)
	}
	// Ten rounds at most, for ten of the first's heartbeat rounds and eight of the second's.
	var first, second []time.Time
	testwait.Until(10*round, func() bool {
		mu.Lock()
		first, second = slices.Clone(arrived["cx0"]), slices.Clone(arrived["cx1"])
		mu.Unlock()
		return len(first) >= 10 && len(second) >= 8
	})
	if len(first) < 10 || len(second) < 8 {
		t.Fatalf("%d and %d heartbeat rounds; want at least 10 and 8", len(first), len(second))
	}
	// Each of the second leader's rounds after its first comes within a few milliseconds of one
	// of the first leader's.
	apart := farFrom(second[1:], first, 25*time.Millisecond)
	if len(apart) > 1 {
		t.Fatalf("%d of the second leader's %d heartbeat rounds came more than 25ms from any of the first's (%v); want them together",
			len(apart), len(second[1:]), apart)
	}
}

// A contender started with more shards than the others grows the leader topic and joins. The
// balancer may well give it the new partitions and leave the others what they led, so no
// contender is assigned a partition beyond its count; the two would then split the keys
// differently, a key in two shards with two leaders. The contender configured for fewer finds
// the topic grown when the join's rebalance assigns it, and stops with an error that says why.
func TestFranzContenderStopsWhenAnotherGrowsTheTopic(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	const heartbeatTimeout = time.Second
	group := fmt.Sprintf("kfake-grown-%d", kfakeElections.Add(1))
	fewer := joinKfake(t, addr, group, "fewer", 2, heartbeatTimeout, func([]int32) {})
	stopped := make(chan error, 1)
	go func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for ; ; <-tick.C {
			if _, err := fewer.Pulse(context.Background()); err != nil {
				stopped <- err
				return
			}
		}
	}()
	t.Cleanup(func() { _ = fewer.Close(context.Background()) })
	if !testwait.Until(30*time.Second, func() bool { return len(fewer.Partitions()) == 2 }) {
		t.Fatal("the first contender did not lead both partitions within 30s")
	}
	more := joinKfake(t, addr, group, "more", 4, heartbeatTimeout, func([]int32) {})
	pulsing(t, more, 10*time.Millisecond)
	select {
	case err := <-stopped:
		if !strings.Contains(err.Error(), "different number of partitions") {
			t.Fatalf("the contender with 2 partitions stopped with %v; want the error naming a different number of partitions", err)
		}
	case <-time.After(10 * heartbeatTimeout):
		t.Fatalf("the contender with 2 partitions still ran 10s after one with 4 joined (leading %v; the other %v); "+
			"it did not notice the grown topic", fewer.Partitions(), more.Partitions())
	}
}

// The leader topic's size, asked at each assignment (see TestFranzContenderStopsWhenAnotherGrowsTheTopic),
// may never be answered. Each ask is bounded: the rebalance whose callbacks ask goes through, the
// contenders lead what they are assigned, Pulse returns within a quarter of the heartbeat
// timeout and a little while it asks again, Ping answers from the heartbeats, and Close returns.
func TestFranzElectorRidesOutAnUnansweredSizeQuestion(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	const heartbeatTimeout = time.Second
	group := fmt.Sprintf("kfake-unanswered-%d", kfakeElections.Add(1))
	var hold atomic.Bool
	var held atomic.Int32
	// The election's own metadata requests ask for the topic's authorized operations; kgo's do not.
	cluster.ControlKey(int16(kmsg.Metadata), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if hold.Load() && req.(*kmsg.MetadataRequest).IncludeTopicAuthorizedOperations {
			held.Add(1)
			return nil, nil, true // taken, never answered
		}
		return nil, nil, false
	})
	first := joinKfake(t, addr, group, "first", 2, heartbeatTimeout, func([]int32) {})
	var mu sync.Mutex
	var longest time.Duration
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			began := time.Now()
			if _, err := first.Pulse(context.Background()); err != nil {
				t.Errorf("Pulse: %v", err)
				return
			}
			mu.Lock()
			longest = max(longest, time.Since(began))
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	if !testwait.Until(30*time.Second, func() bool { return len(first.Partitions()) == 2 }) {
		t.Fatal("the first contender did not lead both partitions within 30s")
	}
	second := joinKfake(t, addr, group, "second", 2, heartbeatTimeout, func([]int32) {})
	if _, err := second.Pulse(t.Context()); err != nil { // its look at the topic, and its join
		t.Fatal(err)
	}
	hold.Store(true) // before the rebalance the join causes reaches the callbacks
	pulsing(t, second, 10*time.Millisecond)
	if !testwait.Until(30*time.Second, func() bool { return len(first.Partitions()) == 1 && len(second.Partitions()) == 1 }) {
		t.Fatalf("leading %v and %v 30s after the second joined with the size unanswered; want one partition each",
			first.Partitions(), second.Partitions())
	}
	// Pulse asks again once a heartbeat timeout; meanwhile the first keeps its partition.
	if !testwait.Throughout(3*heartbeatTimeout, 10*time.Millisecond, func() bool { return first.Leading() && len(first.Partitions()) == 1 }) {
		t.Fatalf("the first contender leads %v (leading %v) with the size unanswered; want its partition kept", first.Partitions(), first.Leading())
	}
	if n := held.Load(); n < 3 {
		t.Fatalf("%d size questions held; want the callbacks' and Pulse's asking again", n)
	}
	if err := first.(driver.Pinger).Ping(t.Context()); err != nil {
		t.Fatalf("Ping while the size goes unanswered: %v", err)
	}
	close(stop)
	<-done
	mu.Lock()
	if limit := heartbeatTimeout/4 + 150*time.Millisecond; longest > limit {
		t.Errorf("a Pulse took %v while the size went unanswered; want at most %v", longest, limit)
	}
	mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := first.Close(ctx); err != nil {
		t.Fatalf("Close while the size goes unanswered: %v", err)
	}
}

// The group members of one process's contenders send their group heartbeats at the same points
// of the process's wake grid, a tenth of the heartbeat timeout apart, not each on its own clock:
// on kgo's clocks, 50 idle outboxes' members woke a reaper 100 times a second at scattered
// instants.
func TestFranzMembersOfOneProcessHeartbeatTheirGroupsTogether(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	const heartbeatTimeout = 4 * time.Second // a round every 400ms; kgo's own every 6s
	const round = heartbeatTimeout / 10
	var mu sync.Mutex
	arrived := map[string][]time.Time{} // group heartbeats by group
	cluster.ControlKey(int16(kmsg.Heartbeat), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		mu.Lock()
		defer mu.Unlock()
		group := req.(*kmsg.HeartbeatRequest).Group
		arrived[group] = append(arrived[group], time.Now())
		return nil, nil, false
	})
	var groups []string
	for i := range 2 {
		group := fmt.Sprintf("kfake-beat-together-%d", kfakeElections.Add(1))
		groups = append(groups, group)
		e := joinKfake(t, addr, group, fmt.Sprintf("gx%d", i), 1, heartbeatTimeout, func([]int32) {})
		pulsing(t, e, 5*time.Millisecond)
		if !testwait.Until(30*time.Second, e.Leading) {
			t.Fatalf("contender %d did not lead within 30s", i)
		}
		time.Sleep(round / 2) // see TestFranzLeadersOfOneProcessHeartbeatTogether
	}
	start := time.Now()
	// Ten rounds at most, for nine group heartbeats of each.
	var first, second []time.Time
	testwait.Until(10*round, func() bool {
		mu.Lock()
		defer mu.Unlock()
		first, second = nil, nil
		for _, at := range arrived[groups[0]] {
			if at.After(start) {
				first = append(first, at)
			}
		}
		for _, at := range arrived[groups[1]] {
			if at.After(start) {
				second = append(second, at)
			}
		}
		return len(first) >= 9 && len(second) >= 9
	})
	// kgo's own heartbeats alone would be one at most in 10 rounds; the grid's are 10.
	if len(first) < 9 || len(second) < 9 {
		t.Fatalf("%d and %d group heartbeats in 10 rounds; want at least 9 each", len(first), len(second))
	}
	// kgo's own (one every 15 rounds) keep their clocks; every other heartbeat of the second
	// member comes within a few milliseconds of one of the first's.
	apart := farFrom(second, first, 25*time.Millisecond)
	if len(apart) > 2 {
		t.Fatalf("%d of the second member's %d group heartbeats came more than 25ms from any of the first's (%v); want all but kgo's own together",
			len(apart), len(second), apart)
	}
}

// A member learns of a rebalance from its heartbeats on the grid, a tenth of the heartbeat
// timeout apart, and joins it at once: kgo's own heartbeats, at three quarters of the session,
// would leave a newcomer waiting up to one and a half heartbeat timeouts for each round.
func TestFranzMemberJoinsARebalanceAtTheGridsRate(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	// A grid round every 2s; kgo's own heartbeat every 30s, the first 0.5s into the session (a
	// cooperative member's quick check), the next 30s after it.
	const heartbeatTimeout = 20 * time.Second
	group := fmt.Sprintf("kfake-beat-rebalance-%d", kfakeElections.Add(1))
	first := joinKfake(t, addr, group, "first", 2, heartbeatTimeout, func([]int32) {})
	pulsing(t, first, 5*time.Millisecond)
	if !testwait.Until(30*time.Second, func() bool { return len(first.Partitions()) == 2 }) {
		t.Fatalf("the first contender did not lead both partitions within 30s: %v", first.Partitions())
	}
	time.Sleep(time.Second) // past the quick check: kgo's next heartbeat is 29.5s away
	joined := time.Now()
	second := joinKfake(t, addr, group, "second", 2, heartbeatTimeout, func([]int32) {})
	pulsing(t, second, 5*time.Millisecond)
	// Two rounds (cooperative: the first gives a partition up, then the second is assigned it),
	// each begun within a grid round of the newcomer's join.
	const within = 7 * time.Second
	if !testwait.Until(within, func() bool { return second.Leading() }) {
		t.Fatalf("the newcomer did not lead within %v of joining (first leads %v); the first member did not notice the rebalance on the grid",
			within, first.Partitions())
	}
	t.Logf("the newcomer led %v after joining", time.Since(joined).Round(time.Millisecond))
}

// A grid heartbeat answered REBALANCE_IN_PROGRESS while kgo is already joining asks for no rejoin:
// one asked then would start another rebalance once this one ends, and the heartbeats of that one
// would ask again. Each join here takes 600ms to be taken up (three grid rounds, as a busy
// coordinator or a slow member can make it), yet members joining together settle, and the group
// then stays as it is. (kfake let a version without that care settle too, after more rounds: 13
// joins in each of four runs, against 7 to 10 with it; so this guards against rejoins that never
// end, not against one more round.)
func TestFranzGridHeartbeatsStartNoRebalanceOfTheirOwn(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	const heartbeatTimeout = 2 * time.Second // a grid round every 200ms
	group := fmt.Sprintf("kfake-beat-settle-%d", kfakeElections.Add(1))
	var joins atomic.Int64
	cluster.ControlKey(int16(kmsg.JoinGroup), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if req.(*kmsg.JoinGroupRequest).Group == group {
			joins.Add(1)
			// kgo sends joins on a connection of their own, so the heartbeats go on meanwhile.
			cluster.SleepControl(func() { time.Sleep(600 * time.Millisecond) })
		}
		return nil, nil, false
	})
	var contenders []driver.Elector
	for i := range 3 {
		e := joinKfake(t, addr, group, fmt.Sprintf("settle%d", i), 6, heartbeatTimeout, func([]int32) {})
		pulsing(t, e, 5*time.Millisecond)
		contenders = append(contenders, e)
	}
	if !testwait.Until(30*time.Second, func() bool {
		n := 0
		for _, e := range contenders {
			if len(e.Partitions()) == 0 {
				return false
			}
			n += len(e.Partitions())
		}
		return n == 6
	}) {
		t.Fatal("the three contenders did not share the 6 partitions within 30s")
	}
	time.Sleep(heartbeatTimeout) // the last round's cooperative follow-up
	before := joins.Load()
	if !testwait.Throughout(3*heartbeatTimeout/2, 10*time.Millisecond, func() bool { return joins.Load() == before }) {
		t.Fatalf("%d JoinGroup requests within %v after the group settled; want none", joins.Load()-before, 3*heartbeatTimeout/2)
	}
}

// farFrom returns, for each of times further than within from every one of others, how far it is
// from the nearest.
func farFrom(times, others []time.Time, within time.Duration) []time.Duration {
	var apart []time.Duration
	for _, at := range times {
		nearest := time.Hour
		for _, other := range others {
			nearest = min(nearest, max(at.Sub(other), other.Sub(at)))
		}
		if nearest > within {
			apart = append(apart, nearest)
		}
	}
	return apart
}

// Group heartbeats that are never answered (a coordinator that takes them and hangs) do not hold
// up the election loop or its readiness check: each of the grid's heartbeats is given up after a
// round. Once they are
// answered again, Close stops them and leaves. (Close while they hang returns at its context,
// as it always has, and leaves kgo's client closing in the background, which the package's leak
// check would count; so the hang ends first here.)
func TestFranzElectionAnswersWhileGroupHeartbeatsHang(t *testing.T) {
	cluster := startKfake(t, kfake.GroupMinSessionTimeout(100*time.Millisecond))
	addr := cluster.ListenAddrs()[0]
	const heartbeatTimeout = time.Second
	group := fmt.Sprintf("kfake-beat-hang-%d", kfakeElections.Add(1))
	var hang atomic.Bool
	release := make(chan struct{})
	var releaseOnce sync.Once
	end := func() { releaseOnce.Do(func() { hang.Store(false); close(release) }) }
	t.Cleanup(end) // before the cluster closes
	cluster.ControlKey(int16(kmsg.Heartbeat), func(kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if hang.Load() {
			cluster.SleepControl(func() { <-release })
		}
		return nil, nil, false
	})
	e := joinKfake(t, addr, group, "hang", 1, heartbeatTimeout, func([]int32) {})
	led := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := e.Pulse(ctx); err != nil {
			t.Fatalf("Pulse: %v", err)
		}
		return e.Leading()
	}
	if !testwait.Until(30*time.Second, led) {
		t.Fatal("the contender did not lead within 30s")
	}
	hang.Store(true)
	// Three heartbeat timeouts of hung group heartbeats: every Pulse returns within a second.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for stop := time.Now().Add(3 * heartbeatTimeout); time.Now().Before(stop); <-tick.C {
		start := time.Now()
		led()
		if took := time.Since(start); took > time.Second {
			t.Fatalf("a Pulse took %v while the group heartbeats hung", took)
		}
		// Ping is what readiness asks of the election.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start = time.Now()
		err := e.(interface{ Ping(context.Context) error }).Ping(ctx)
		cancel()
		if took := time.Since(start); took > 1100*time.Millisecond {
			t.Fatalf("a Ping took %v (%v) while the group heartbeats hung", took, err)
		}
	}
	end()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := e.Close(ctx); err != nil {
		t.Fatalf("Close after the hang ended: %v", err)
	}
}
