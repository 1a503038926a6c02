package neli

import (
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// The broker that coordinates the group crashes, and the takeover by another coordinator outlasts
// librdkafka's session: a 4s heartbeat timeout makes 8s sessions, shorter than the 9s the
// controller waits before it fences a broker (broker.session.timeout.ms). librdkafka drops the
// membership of each contender whose session runs out and joins again. Joining in its own static
// membership's place, a contender must be given partitions as soon as the new coordinator
// serves, not a session later, when a dynamic member's old membership would expire and let the
// rebalance complete. The run also meets librdkafka's fatal FENCED_INSTANCE_ID at times, which
// the contender must survive (replaceConsumer).
func TestGroupCoordinatorCrashCostsNoSession(t *testing.T) {
	const heartbeatTimeout, partitions = 4 * time.Second, 8
	session, _, _ := timeouts(heartbeatTimeout)
	// A cluster of its own: the test kills a node.
	c := kafkacluster.Start(t, kafkacluster.Nodes(3), kafkacluster.GroupDefaults())
	group := newGroup("coordinator")
	coordinator, err := c.Coordinator(kafkacluster.GroupCoordinator, group)
	if err != nil {
		t.Fatal(err)
	}
	// The crashed broker leads no partition of the leader topic, so that only the coordinator's
	// move can cost leadership.
	if err := c.CreateTopicLedByOthers(group+".leader", partitions, coordinator.ID); err != nil {
		t.Fatal(err)
	}
	cs := startContenders(t, c.Addr(), group, 3, func(cfg *Config) {
		cfg.Partitions, cfg.HeartbeatTimeout, cfg.MinPollInterval = partitions, heartbeatTimeout, 100*time.Millisecond
	})
	waitForBalance(t, time.Minute, partitions, 2, 3, cs...)

	coordinator.Kill()
	killed := time.Now()
	var served time.Time
	if !testwait.Until(time.Minute, func() bool {
		n, err := c.Coordinator(kafkacluster.GroupCoordinator, group)
		if err == nil && n.ID != coordinator.ID {
			served = time.Now()
			return true
		}
		return false
	}) {
		t.Fatal("no other node coordinates the group within a minute of the crash")
	}
	// The revokes come when librdkafka's sessions run out, before or after the new coordinator
	// serves; a contender whose session outlasted the takeover keeps its partitions. Each
	// contender that lost its membership must be given partitions again.
	after := func(c *contender, want func(Event) bool, since time.Time) time.Time {
		for _, te := range c.eventLog() {
			if te.at.After(since) && want(te.ev) {
				return te.at
			}
		}
		return time.Time{}
	}
	isAcquired := func(e Event) bool { _, ok := e.(Acquired); return ok }
	if !testwait.Until(time.Minute, func() bool {
		for _, c := range cs {
			if !after(c, isRevoked, killed).IsZero() {
				return true
			}
		}
		return false
	}) {
		t.Skip("no contender lost its membership: the new coordinator served within librdkafka's session")
	}
	var again time.Time
	if !testwait.Until(time.Minute, func() bool {
		again = time.Time{}
		for _, c := range cs {
			if revoked := after(c, isRevoked, killed); !revoked.IsZero() {
				acquired := after(c, isAcquired, revoked)
				if acquired.IsZero() {
					return false
				}
				if acquired.After(again) {
					again = acquired
				}
			}
		}
		return true
	}) {
		t.Fatalf("a contender that lost its membership was given no partition again within a minute")
	}
	waitForBalance(t, time.Minute, partitions, 2, 3, cs...)
	t.Logf("coordinator (node %d) killed; another served after %v; the contenders that lost their membership led again %v after that",
		coordinator.ID, served.Sub(killed).Round(time.Millisecond), again.Sub(served).Round(time.Millisecond))
	// Waiting for an old membership to expire takes a session from when the new coordinator
	// loaded the group, which is shortly before it is seen serving: half a session tells the two
	// apart (a rejoin in place took 1-1.5s here, a dynamic member's about 8s).
	if again.Sub(served) >= session/2 {
		t.Errorf("the contenders that lost their membership led again %v after the new coordinator served, half a session (%v) or more: the group waited for old memberships to expire",
			again.Sub(served).Round(time.Millisecond), session/2)
	}
	for _, c := range cs {
		checkEventOrder(t, c)
	}
}

// Two contenders with one name (two pods of a host name, say) are two members: the membership
// is static, and a shared identity would let the second take the first's place and partitions
// while the first still leads (see Config.instanceID).
func TestContendersWithOneNameAreTwoMembers(t *testing.T) {
	addr, group := kafkacluster.Shared(t).Addr(), newGroup("samename")
	cs := []*contender{startContender(t, addr, group, "same"), startContender(t, addr, group, "same")}
	leader := waitForSteadyLeader(t, 15*time.Second, 3*testHeartbeatTimeout, cs...)
	leader.stop(t) // reports an error of its loop: a fenced instance ID is one
	waitForSteadyLeader(t, 15*time.Second, 2*testHeartbeatTimeout, others(cs, leader)...)
}
