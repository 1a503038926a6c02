package epoch

import "sync"

// The pipeline's stages talk through two kinds of channel whose sends never block, so that no
// stage can wait forever on another that waits on it: a wake (one slot, tokens merge) and a
// mailbox (an unbounded queue with a wake). How much either holds depends on nothing else in the
// pipeline, so no argument about channel sizes is needed for the pipeline to make progress.

// wake is a one-slot channel that tells a goroutine to look again at something it owns or
// something guarded by a lock; repeated pokes before it looks merge into one.
type wake chan struct{}

func newWake() wake { return make(wake, 1) }

// poke leaves a token unless one is already waiting; it never blocks.
func (w wake) poke() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// mailbox is an unbounded queue of messages for one stage. post never blocks; the receiver waits
// on ready, then takes what has gathered. Several receivers may share a mailbox: one that leaves
// messages behind passes the token on.
type mailbox[T any] struct {
	mu     sync.Mutex
	items  []T  // guarded by mu
	closed bool // guarded by mu: post drops messages, and ready stays ready
	ready  wake // a token while messages may wait; closed with the mailbox
}

func newMailbox[T any]() *mailbox[T] { return &mailbox[T]{ready: newWake()} }

// post queues messages; after close it drops them.
func (m *mailbox[T]) post(msgs ...T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.items = append(m.items, msgs...)
	m.ready.poke()
}

// take returns up to limit of the waiting messages (all of them when limit is 0), oldest first,
// and whether the mailbox is closed.
func (m *mailbox[T]) take(limit int) (msgs []T, closed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if limit <= 0 || limit >= len(m.items) {
		msgs, m.items = m.items, nil
	} else {
		msgs = append([]T(nil), m.items[:limit]...)
		m.items = m.items[limit:]
		if !m.closed { // a closed ready is ready for good
			m.ready.poke() // for another receiver, or this one's next take
		}
	}
	return msgs, m.closed
}

// wait blocks until messages wait and takes up to limit of them (see take); it returns false once
// the mailbox is closed and empty.
func (m *mailbox[T]) wait(limit int) ([]T, bool) {
	for {
		msgs, closed := m.take(limit)
		if len(msgs) > 0 {
			return msgs, true
		}
		if closed {
			return nil, false
		}
		<-m.ready
	}
}

// close has the receivers return from wait once they have taken what is left.
func (m *mailbox[T]) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		close(m.ready)
	}
}
