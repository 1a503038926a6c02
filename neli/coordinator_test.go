package neli

import (
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/kafkacluster"
	"github.com/goharvest/goharvest/internal/testwait"
)

// The broker that coordinates the group crashes, and the takeover by another coordinator outlasts
// librdkafka's session: a 4s heartbeat timeout makes 8s sessions, shorter than the 9s the
// controller waits before it fences a broker (broker.session.timeout.ms). Each contender's
// librdkafka drops its membership and joins again. Joining in its own static membership's place,
// it must be given partitions as soon as the new coordinator serves, not a session later, when a
// dynamic member's old membership would expire and let the rebalance complete.
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
	// serves, at about the same moment for every contender; every partition must then be led
	// again.
	revoked := func(c *contender) bool {
		for _, te := range c.eventLog() {
			if te.at.After(killed) && isRevoked(te.ev) {
				return true
			}
		}
		return false
	}
	if !testwait.Until(time.Minute, func() bool {
		for _, c := range cs {
			if !revoked(c) {
				return false
			}
		}
		return true
	}) {
		for _, c := range cs {
			if revoked(c) {
				t.Fatalf("%s lost its membership and another contender did not", c.name)
			}
		}
		t.Skip("no contender lost its membership: the new coordinator served within librdkafka's session")
	}
	waitForBalance(t, time.Minute, partitions, 2, 3, cs...)
	again := time.Now()
	t.Logf("coordinator (node %d) killed; another served after %v; every partition led again %v after that",
		coordinator.ID, served.Sub(killed).Round(time.Millisecond), again.Sub(served).Round(time.Millisecond))
	if again.Sub(served) >= session {
		t.Errorf("the partitions were led again %v after the new coordinator served, a session (%v) or more: the group waited for old memberships to expire",
			again.Sub(served).Round(time.Millisecond), session)
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
