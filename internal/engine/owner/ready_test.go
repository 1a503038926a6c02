package owner

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/goharvest/goharvest/driver"
)

// A leader whose marks keep failing while its database still answers pings (as behind a pooler
// that rejects its statements) publishes nothing: Ready says so, naming the failing operation
// (and with marks, whose failure ends the epoch, goharvest_leader reads 0); once marks succeed
// again, both recover.
func TestReadyReportsLeaderThatCannotPublish(t *testing.T) {
	inBubble(t, func(t *testing.T) {
		r := newRig(t, fastLimits())
		ids := r.load(5, 20)
		r.start()
		r.waitEmpty(10 * time.Second)
		if err := r.h.Ready(t.Context()); err != nil {
			t.Fatalf("Ready while publishing: %v", err)
		}

		r.db.mu.Lock()
		r.db.failMk = 1 << 30
		r.db.mu.Unlock()
		var notReady error
		r.waitFor("Ready to report the failing marks", 10*time.Second, func() bool {
			notReady = r.h.Ready(t.Context())
			return notReady != nil
		})
		for _, want := range []string{"elected leader cannot publish", "database", "failures", "mark", errDBDown.Error()} {
			if !strings.Contains(notReady.Error(), want) {
				t.Errorf("Ready says %q; want it to mention %q", notReady, want)
			}
		}
		if claimStrategy == ClaimByMarking {
			// A failed mark ends the epoch: between two failed epochs there is no pipeline, and the
			// gauge must not claim one. (A failed read ends nothing; the epoch reads again.)
			r.waitFor("goharvest_leader to read 0", 10*time.Second, func() bool {
				return testutil.ToFloat64(r.h.metrics.Leader) == 0 && r.h.Ready(t.Context()) != nil
			})
		}

		r.db.mu.Lock()
		r.db.failMk = 0
		r.db.mu.Unlock()
		more := r.add(driver.OutboxRecord{KafkaTopic: "t", KafkaKey: "k0", KafkaValue: String("after")})
		r.waitEmpty(10 * time.Second)
		r.waitFor("Ready again", 10*time.Second, func() bool {
			return r.h.Ready(t.Context()) == nil && testutil.ToFloat64(r.h.metrics.Leader) == 1
		})
		r.stop()
		r.checkOrder(append(ids, more...))
	})
}

// A standby is not to blame for an outage it saw while it led: Ready looks at the outage only
// while this harvester is elected.
func TestReadyIgnoresOutageOfStandby(t *testing.T) {
	r := newRig(t, fastLimits())
	r.start()
	defer r.stop()
	r.waitFor("leadership", 10*time.Second, func() bool { return r.h.IsLeader() })
	r.h.dbTrouble.Fail(r.h.log, "mark", errDBDown)
	r.h.dbTrouble.Fail(r.h.log, "mark", errDBDown)
	r.elector.set(0) // neli's first state: not the leader
	if err := r.h.Ready(t.Context()); err != nil && strings.Contains(err.Error(), "cannot publish") {
		t.Fatalf("a standby reports %v", err)
	}
}
