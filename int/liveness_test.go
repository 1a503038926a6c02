package int

import (
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// The broker holds some transaction commits (EndTxn) for longer than the heartbeat timeout. The
// leader waits them out, calling CommitTransaction again, rather than aborting (which librdkafka
// refuses while a commit is under way) and ending its epoch; it stays leader throughout. kfake
// only: it holds chosen EndTxn requests.
func TestSlowTransactionCommits(t *testing.T) {
	r := newRig(t, rigOptions{kafka: kfakeOnly})
	r.startWriters(4, 1000, 2000)
	reapers := []*reaper{r.startReaper("a"), r.startReaper("b")}
	waitLeader(t, 30*time.Second, reapers...)
	r.waitProgress(1000, 30*time.Second)
	leader := waitLeader(t, 30*time.Second, reapers...) // after the group has settled

	var slow atomic.Bool
	var commits, delayed atomic.Int64
	slow.Store(true)
	hold := 1500 * time.Millisecond // the heartbeat timeout is 1s
	r.fake.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		r.fake.KeepControl()
		if end, ok := req.(*kmsg.EndTxnRequest); ok && end.Commit && slow.Load() && commits.Add(1)%5 == 1 {
			delayed.Add(1)
			r.fake.SleepControl(func() { time.Sleep(hold) }) // the slow commit being simulated
		}
		return nil, nil, false
	})
	remarksBefore, fencesBefore := leader.counts()
	for range pick(3, 10) {
		r.waitProgress(1000, time.Minute)
	}
	slow.Store(false)
	remarks, fences := leader.counts()
	remarks, fences = remarks-remarksBefore, fences-fencesBefore
	if !leader.isLeading() || remarks != 0 || fences != 0 {
		t.Errorf("leader %s: leading %v, %d remarks, %d fences while commits were slow", leader.name, leader.isLeading(), remarks, fences)
	}
	if delayed.Load() == 0 {
		t.Fatal("no commit was delayed")
	}
	report := r.finish(3 * time.Minute)
	figure(t, "slow commits", "%d of %d commits held %v (heartbeat timeout 1s); leader remarks %d, fences %d; records %d, duplicates %d, lost %d, reversals %d",
		delayed.Load(), commits.Load(), hold, remarks, fences, report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// The database stops answering (every Postgres process SIGSTOPped) and the leader is killed, so
// that its successor is elected while its epoch cannot start. The successor's election loop
// must not wait on the database: it stays in the group (librdkafka evicts a member that does not
// poll for 2 heartbeat timeouts) and publishes as soon as the database answers again. Then, with
// the database frozen again, the leader is killed once more and the reaper elected next is
// stopped with SIGTERM while its epoch start hangs: it must exit promptly, and the last reaper
// standing takes over.
func TestDatabaseHangsDuringEpochStart(t *testing.T) {
	server := pgtest.Shared(t)
	databaseHangs(t, "database hangs during epoch start", "Postgres", rigOptions{}, server.Freeze, server.Thaw)
}

// TestDatabaseHangsDuringEpochStart with the outbox in MariaDB, whose server process is
// SIGSTOPped: a MySQL server that accepts connections and never answers.
func TestMySQLServerHangsDuringEpochStart(t *testing.T) {
	pid := mariadbtest.Shared(t).PID()
	signal := func(sig syscall.Signal) func() error { return func() error { return syscall.Kill(pid, sig) } }
	databaseHangs(t, "database hangs during epoch start, MySQL", "MariaDB", rigOptions{mysql: true}, signal(syscall.SIGSTOP), signal(syscall.SIGCONT))
}

// databaseHangs is TestDatabaseHangsDuringEpochStart on the rig o makes, with the database (the
// server named serverName) frozen and thawed by freezeServer and thawServer.
func databaseHangs(t *testing.T, scenario, serverName string, o rigOptions, freezeServer, thawServer func() error) {
	o.extraYAML = "admin:\n  address: 127.0.0.1:0" // /readyz, asked while the database hangs
	r := newRig(t, o)
	r.startWriters(4, 1000, 2000)
	reapers := []*reaper{r.startReaper("a"), r.startReaper("b"), r.startReaper("c"), r.startReaper("d")}
	waitLeader(t, 30*time.Second, reapers...)
	r.waitProgress(1000, 30*time.Second)
	rounds, hung := pick(1, 3), 3*time.Second
	var stops []time.Duration

	freeze := func() func() {
		if err := freezeServer(); err != nil {
			t.Fatal(err)
		}
		var once sync.Once
		thaw := func() {
			once.Do(func() {
				if err := thawServer(); err != nil {
					t.Fatal(err)
				}
			})
		}
		t.Cleanup(thaw)
		return thaw
	}
	// killLeader kills the leader and returns the reaper elected next, once the election says so
	// (its epoch cannot start while the database is frozen).
	killLeader := func(round int) *reaper {
		leader := waitLeader(t, 30*time.Second, reapers...)
		leader.signal(syscall.SIGKILL)
		leader.waitExit(t, 10*time.Second)
		reapers = slices.DeleteFunc(reapers, func(p *reaper) bool { return p == leader })
		killed := time.Now()
		var successor *reaper
		if !testwait.Until(15*time.Second, func() bool {
			for _, p := range reapers {
				p.mu.Lock()
				elected := p.elected.After(killed)
				p.mu.Unlock()
				if elected {
					successor = p
				}
			}
			return successor != nil
		}) {
			t.Fatalf("round %d: no reaper was elected after %s was killed", round, leader.name)
		}
		return successor
	}

	for round := range rounds {
		thaw := freeze()
		successor := killLeader(round)
		_, lostBefore := successor.counts()
		// Its readiness asks the database, which does not answer: it must say so within its bound.
		asked := time.Now()
		if code := successor.askReady(t); code != http.StatusServiceUnavailable {
			t.Errorf("round %d: %s's /readyz answered %d while the database hung; want 503", round, successor.name, code)
		}
		time.Sleep(hung - time.Since(asked)) // how long the database stays frozen
		thaw()
		waitLeader(t, 30*time.Second, successor)
		r.waitProgress(1000, time.Minute)
		// A loop that had waited on the database would have been evicted, or found its heartbeats
		// stale once it ran again.
		if _, lost := successor.counts(); lost != lostBefore {
			t.Errorf("round %d: %s lost leadership: its election loop waited on the database", round, successor.name)
		}

		thaw = freeze()
		next := killLeader(round)
		stopped := time.Now()
		next.signal(syscall.SIGTERM)
		code := next.waitExit(t, 30*time.Second)
		took := time.Since(stopped)
		stops = append(stops, took)
		reapers = slices.DeleteFunc(reapers, func(p *reaper) bool { return p == next })
		thaw()
		if code != 0 || took > 5*time.Second {
			t.Errorf("round %d: %s exited %d %v after SIGTERM while its epoch start hung", round, next.name, code, took)
		}
		waitLeader(t, 30*time.Second, reapers...)
		r.waitProgress(1000, time.Minute)
		t.Logf("round %d: %s elected while the database hung %v and kept leadership; %s stopped in %v while its start hung",
			round, successor.name, hung, next.name, took.Round(time.Millisecond))
		// Each round takes three reapers (one killed twice over, one stopped): three fresh ones
		// keep four in the group.
		for _, name := range []string{"a", "b", "c"} {
			reapers = append(reapers, r.startReaper(fmt.Sprintf("r%d%s", round, name)))
		}
	}
	report := r.finish(3 * time.Minute)
	figure(t, scenario, "%d rounds: %s frozen (SIGSTOP), the leader killed, its successor elected and kept leadership %v without a database; a reaper stopped (SIGTERM) while its epoch start hung, exit after max %v; records %d, duplicates %d, lost %d, reversals %d",
		rounds, serverName, hung, slices.Max(stops).Round(time.Millisecond), report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}
