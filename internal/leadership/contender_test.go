package leadership

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

// contender is a Contender whose heartbeats, Barrier runs and changes a test reads back.
type contender struct {
	*Contender
	sent     []Beat
	barriers [][]int32
	changes  []string
	left     int
}

var changeNames = map[Change]string{Acquired: "acquired", SelfFenced: "fenced", Revoked: "revoked"}

func newContender(partitions int, timeout time.Duration) *contender {
	c := &contender{}
	c.Contender = NewContender(Config{
		Client: "test", LeaderTopic: "leader", LeaderGroupID: "group", Name: "me",
		Partitions: partitions, HeartbeatTimeout: timeout, MinPollInterval: timeout / 10,
		Send:     func(b Beat) { c.sent = append(c.sent, b) },
		Barrier:  func(ps []int32) { c.barriers = append(c.barriers, ps) },
		OnChange: func(ch Change, ps []int32) { c.changes = append(c.changes, changeNames[ch]+fmt.Sprint(ps)) },
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	return c
}

// pulse ends a pulse in which the beats sent so far come back with err (nil: acknowledged).
func (c *contender) pulse(err error) (bool, error) {
	acks := func() {
		for _, b := range c.sent {
			if failed := c.Delivered(b, err); failed != nil {
				c.HeartbeatFailed(failed, false)
			}
		}
		c.sent = nil
	}
	return c.EndPulse(func() int { return 0 }, acks, func() { c.left++ })
}

// A leader whose heartbeats go unacknowledged fences itself after the timeout, runs the Barrier
// once, and leaves the group; the revoke that follows runs no second Barrier, and the heartbeats
// of the leadership before are nothing to the next.
func TestContenderFencesASilentLeaderOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const timeout = 100 * time.Millisecond
		c := newContender(2, timeout)
		c.Acquire([]int32{1, 0})
		if len(c.sent) != 2 || !slices.Equal(c.changes, []string{"acquired[1 0]"}) {
			t.Fatalf("a beginning leadership sent %v and told of %v; want a round to both partitions and Acquired", c.sent, c.changes)
		}
		if leading, err := c.pulse(nil); !leading || err != nil {
			t.Fatalf("EndPulse = %v, %v with its heartbeats acknowledged", leading, err)
		}
		sent := time.Now()
		old := c.Heartbeat(0, sent)
		advanceTo(sent.Add(timeout + timeout/2))
		if leading, err := c.pulse(errors.New("timed out")); leading || err != nil || c.left != 1 {
			t.Fatalf("a silent leader: EndPulse = %v, %v, left the group %d times", leading, err, c.left)
		}
		if fmt.Sprint(c.barriers) != "[[0 1]]" || c.changes[len(c.changes)-1] != "fenced[0 1]" {
			t.Fatalf("fencing ran the Barrier %v and told of %v; want [[0 1]] and SelfFenced", c.barriers, c.changes)
		}
		c.RevokeAll()
		if len(c.barriers) != 1 || c.changes[len(c.changes)-1] != "revoked[0 1]" {
			t.Fatalf("the revoke after a fence ran the Barrier %v and told of %v", c.barriers, c.changes)
		}
		c.Acquire([]int32{0})
		if err := c.Delivered(old, errors.New("refused")); err != nil {
			t.Fatalf("the failure of an earlier leadership's heartbeat is handed back: %v", err)
		}
		if err := c.Delivered(c.sent[len(c.sent)-1], errors.New("refused")); err == nil {
			t.Fatal("the failure of this leadership's heartbeat is not handed back")
		}
	})
}

// A leader topic larger than configured, or a partition at or above the configured count, stops
// the contender: another member runs with a different number of partitions.
func TestContenderStopsOnAnotherPartitionCount(t *testing.T) {
	c := newContender(2, time.Second)
	if !c.SizeRead(0) || !c.SizeRead(2) || c.Err() != nil {
		t.Fatalf("an unknown or equal size stopped the contender: %v", c.Err())
	}
	if c.SizeRead(3) || c.Err() == nil || !strings.Contains(c.Err().Error(), "different number of partitions") {
		t.Fatalf("a topic of 3 partitions for 2: %v", c.Err())
	}
	c = newContender(2, time.Second)
	if c.Acquire([]int32{0, 2}); c.Err() == nil || c.Leading() {
		t.Fatalf("assigned partition 2 of 2: %v, leading %v", c.Err(), c.Leading())
	}
	if _, err := c.pulse(nil); err == nil {
		t.Fatal("EndPulse does not return the error that stopped the contender")
	}
}
