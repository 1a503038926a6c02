// Package mailbox holds the two kinds of channel whose sends never block, which goharvest's
// goroutines talk through so that none can wait forever on another that waits on it: a wake (one
// slot, tokens merge) and a mailbox (an unbounded queue with a wake). How much either holds
// depends on nothing else, so no argument about channel sizes is needed for progress.
package mailbox

import "sync"

// Wake is a one-slot channel that tells a goroutine to look again at something it owns or
// something guarded by a lock; repeated pokes before it looks merge into one.
type Wake chan struct{}

// NewWake returns a wake without a token.
func NewWake() Wake { return make(Wake, 1) }

// Poke leaves a token unless one is already waiting; it never blocks.
func (w Wake) Poke() {
	select {
	case w <- struct{}{}:
	default:
	}
}

// Mailbox is an unbounded queue of messages for one receiving goroutine, or several. Post never
// blocks; the receiver waits on Ready, then takes what has gathered. Several receivers may share a mailbox: one that leaves
// messages behind passes the token on.
type Mailbox[T any] struct {
	mu     sync.Mutex
	items  []T  // guarded by mu
	closed bool // guarded by mu: Post drops messages, and Ready stays ready
	// Ready holds a token while messages may wait, and is closed with the mailbox.
	Ready Wake
}

// New returns an empty mailbox.
func New[T any]() *Mailbox[T] { return &Mailbox[T]{Ready: NewWake()} }

// Post queues messages; after Close it drops them.
func (m *Mailbox[T]) Post(msgs ...T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	m.items = append(m.items, msgs...)
	m.Ready.Poke()
}

// Take returns up to limit of the waiting messages (all of them when limit is 0), oldest first,
// and whether the mailbox is closed.
func (m *Mailbox[T]) Take(limit int) (msgs []T, closed bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if limit <= 0 || limit >= len(m.items) {
		msgs, m.items = m.items, nil
	} else {
		msgs = append([]T(nil), m.items[:limit]...)
		m.items = m.items[limit:]
		if !m.closed { // a closed Ready is ready for good
			m.Ready.Poke() // for another receiver, or this one's next take
		}
	}
	return msgs, m.closed
}

// Wait blocks until messages wait and takes up to limit of them (see Take); it returns false once
// the mailbox is closed and empty.
func (m *Mailbox[T]) Wait(limit int) ([]T, bool) {
	for {
		msgs, closed := m.Take(limit)
		if len(msgs) > 0 {
			return msgs, true
		}
		if closed {
			return nil, false
		}
		<-m.Ready
	}
}

// Close has the receivers return from Wait once they have taken what is left.
func (m *Mailbox[T]) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.closed {
		m.closed = true
		close(m.Ready)
	}
}
