// Package dispatch delivers events to a handler in order, on a goroutine of its own, so that the
// code raising them never waits for the handler.
package dispatch

import "sync"

// Dispatcher queues events for one handler. Its queue is unbounded: it is meant for events that
// are rare compared with the work around them (leadership changes, periodic readings).
type Dispatcher[E any] struct {
	mu      sync.Mutex
	wake    chan struct{} // one slot: repeated wake-ups merge
	queue   []E
	closing bool
	done    chan struct{}
}

// New starts a dispatcher; a nil handler discards events.
func New[E any](handler func(E)) *Dispatcher[E] {
	d := &Dispatcher[E]{wake: make(chan struct{}, 1), done: make(chan struct{})}
	go d.run(handler)
	return d
}

func (d *Dispatcher[E]) run(handler func(E)) {
	defer close(d.done)
	for range d.wake {
		for {
			d.mu.Lock()
			if len(d.queue) == 0 {
				closing := d.closing
				d.mu.Unlock()
				if closing {
					return
				}
				break
			}
			ev := d.queue[0]
			d.queue = d.queue[1:]
			d.mu.Unlock()
			if handler != nil {
				handler(ev)
			}
		}
	}
}

// Emit queues ev. It never blocks on the handler.
func (d *Dispatcher[E]) Emit(ev E) {
	d.mu.Lock()
	d.queue = append(d.queue, ev)
	d.mu.Unlock()
	d.poke()
}

// Close lets the dispatcher deliver what is queued and stop; Done is closed when it has.
func (d *Dispatcher[E]) Close() {
	d.mu.Lock()
	d.closing = true
	d.mu.Unlock()
	d.poke()
}

// Done is closed once the dispatcher has delivered everything and stopped.
func (d *Dispatcher[E]) Done() <-chan struct{} { return d.done }

func (d *Dispatcher[E]) poke() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}
