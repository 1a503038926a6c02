package memory

import (
	"context"
	"errors"
	"slices"
	"sync"

	"github.com/goharvest/goharvest/driver"
)

var _ driver.Elector = (*Elector)(nil)

// Election is an in-memory leader election: its contenders (Join) contend for its partitions
// (the shards), and one of them leads them all at a time. A contender that pulses while no other
// leads becomes the leader; it leads until it closes, or a test hook (Revoke, Fence) takes
// leadership away, and another contender's next Pulse takes over. The zero value is not usable;
// NewElection makes one.
type Election struct {
	mu         sync.Mutex
	partitions []int32
	leader     *Elector // nil: none
}

// NewElection returns an election of partitions partitions (at least one).
func NewElection(partitions int) *Election {
	el := &Election{}
	for p := range max(partitions, 1) {
		el.partitions = append(el.partitions, int32(p))
	}
	return el
}

// NewElector returns the one contender of an election of one partition: it leads from its first
// Pulse, until a test hook takes leadership away. lost is its barrier (see Join).
func NewElector(lost func(partitions []int32)) *Elector { return NewElection(1).Join(lost) }

// Join adds a contender. lost, if not nil, is its barrier: called within Pulse, with the
// partitions it led, once it has lost them to Revoke; leadership is not handed on before lost
// returns. Its signature fits the engine's NewElector.
func (el *Election) Join(lost func(partitions []int32)) *Elector {
	return &Elector{el: el, lost: lost}
}

// ErrClosed is what Pulse returns once the Elector is closed.
var ErrClosed = errors.New("the elector is closed")

// Elector is one contender of an Election; it implements driver.Elector.
type Elector struct {
	el   *Election
	lost func([]int32)

	// Guarded by el.mu:
	leading   bool
	fenced    bool
	withdrawn bool          // by Revoke: does not lead again before Elect
	lostParts []int32       // partitions to pass to lost at the next Pulse
	revoked   chan struct{} // closed once lost has returned; nil: no revoke pending
	closed    bool
	pulses    int
}

// Pulse implements driver.Elector: it runs the barrier for a revoke, then takes leadership if
// no other contender holds it (and no hook keeps this one out). It returns ErrClosed once the
// Elector is closed.
func (e *Elector) Pulse(ctx context.Context) (bool, error) {
	el := e.el
	el.mu.Lock()
	if e.closed {
		el.mu.Unlock()
		return false, ErrClosed
	}
	e.pulses++
	parts, revoked := e.lostParts, e.revoked
	if parts == nil {
		revoked = nil // no revoke, or its barrier already running
	}
	e.lostParts = nil
	el.mu.Unlock()
	if revoked != nil {
		if e.lost != nil {
			e.lost(parts)
		}
		el.mu.Lock()
		if e.revoked == revoked { // else Close has closed it
			close(revoked)
			e.revoked = nil
		}
		if el.leader == e {
			el.leader = nil
		}
		el.mu.Unlock()
	}
	el.mu.Lock()
	defer el.mu.Unlock()
	if !e.leading && !e.fenced && !e.withdrawn && e.revoked == nil && el.leader == nil && !e.closed {
		e.leading, el.leader = true, e
	}
	return e.leading, nil
}

// Leading implements driver.Elector.
func (e *Elector) Leading() bool {
	e.el.mu.Lock()
	defer e.el.mu.Unlock()
	return e.leading
}

// Fenced implements driver.Elector: set by Fence, until Elect.
func (e *Elector) Fenced() bool {
	e.el.mu.Lock()
	defer e.el.mu.Unlock()
	return e.fenced
}

// Partitions implements driver.Elector: every partition of the election while leading.
func (e *Elector) Partitions() []int32 {
	e.el.mu.Lock()
	defer e.el.mu.Unlock()
	if !e.leading {
		return nil
	}
	return slices.Clone(e.el.partitions)
}

// Close implements driver.Elector: a leader lets another contender lead at once.
func (e *Elector) Close(context.Context) error {
	e.el.mu.Lock()
	defer e.el.mu.Unlock()
	e.release()
	e.closed = true
	if e.revoked != nil { // no Pulse will run the barrier
		close(e.revoked)
		e.revoked = nil
	}
	return nil
}

// release gives up leadership, if held. Called with el.mu held.
func (e *Elector) release() {
	e.leading = false
	if e.el.leader == e {
		e.el.leader = nil
	}
}

// Revoke takes leadership away as a rebalance of neli's group does: Leading turns false at once,
// the next Pulse calls the barrier with the partitions lost, and the contender does not lead
// again until Elect. The channel returned is closed once the barrier has returned (at once when
// the contender was not leading). Another contender may lead only after the barrier returned.
// Test hook.
func (e *Elector) Revoke() <-chan struct{} {
	el := e.el
	el.mu.Lock()
	defer el.mu.Unlock()
	e.withdrawn = true
	if e.revoked != nil {
		return e.revoked
	}
	done := make(chan struct{})
	if !e.leading {
		close(done)
		return done
	}
	e.leading = false // el.leader stays until the barrier returns: the handover waits for it
	e.lostParts = slices.Clone(el.partitions)
	e.revoked = done
	return done
}

// Fence makes the contender fence itself, as neli does after losing touch with Kafka: Leading
// turns false and Fenced true at once, without a barrier, and another contender may lead. It
// stays fenced until Elect. Test hook.
func (e *Elector) Fence() {
	e.el.mu.Lock()
	defer e.el.mu.Unlock()
	e.release()
	e.fenced = true
}

// Elect ends Revoke and Fence: the contender leads again from its next Pulse, if no other
// contender leads. Test hook.
func (e *Elector) Elect() {
	e.el.mu.Lock()
	defer e.el.mu.Unlock()
	e.withdrawn, e.fenced = false, false
}

// Pulses returns how many times Pulse was called before Close.
func (e *Elector) Pulses() int {
	e.el.mu.Lock()
	defer e.el.mu.Unlock()
	return e.pulses
}

// Closed reports whether Close was called.
func (e *Elector) Closed() bool {
	e.el.mu.Lock()
	defer e.el.mu.Unlock()
	return e.closed
}
