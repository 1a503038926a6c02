// Package topiccheck decides, for the Kafka drivers, whether a message's topic exists, so that a
// message for a missing topic is refused up front rather than held by the client until the
// transaction holding it cannot commit. Each driver asks Kafka in its own way (its describe
// function); this package owns what it learnt and when to ask again. It imports no Kafka client,
// so it builds without cgo.
package topiccheck

import (
	"sync"
	"time"

	"github.com/goharvest/goharvest/driver"
)

const (
	// defaultRecheck is how long a topic found missing stays rejected before metadata is asked
	// again.
	defaultRecheck = time.Second
	// defaultCreateWait is how long a lookup keeps asking about a topic that Kafka's metadata says
	// is missing before it is rejected. A broker that creates topics on demand (Apache Kafka's
	// default) answers the request that makes it create one "unknown topic", and lists the topic
	// a moment later; rejecting at once would report a record failed that needed only to wait.
	defaultCreateWait = 2 * time.Second
	// firstRetry is how long a lookup waits before it asks about a missing topic the second time;
	// each wait after is twice the last.
	firstRetry = 100 * time.Millisecond
)

// Checker remembers, per topic, whether Kafka's metadata showed it usable, and looks a topic up
// in the background the first time it is checked. Its methods are safe for concurrent use.
type Checker struct {
	describe func(topic string) error
	// recheck and createWait are defaultRecheck and defaultCreateWait; fields, set by New, only so
	// that this package's tests can shorten them before the first Check.
	recheck    time.Duration
	createWait time.Duration

	mu     sync.Mutex
	topics map[string]state // what was last learnt of each topic; guarded by mu

	lookups sync.WaitGroup // lookups under way; Close waits for them
	closing chan struct{}  // closed by Close: lookups stop waiting for a topic to appear
}

// state is what the Checker last learnt of a topic: usable (err nil) or not, and when; or that a
// lookup is under way.
type state struct {
	err     error
	at      time.Time
	pending bool
}

// New returns a Checker that learns of a topic by calling describe, on a goroutine of the
// Checker's own. describe asks Kafka for the topic's metadata once and returns nil if the topic
// is usable, or usable as far as it can tell when Kafka did not answer (the produce itself will
// show what is wrong); or the error (a *driver.RejectedError) that Check then returns for the
// topic, missing or forbidden. It may take as long as a metadata request does.
func New(describe func(topic string) error) *Checker {
	return &Checker{describe: describe, recheck: defaultRecheck, createWait: defaultCreateWait,
		topics: map[string]state{}, closing: make(chan struct{})}
}

// Check returns nil for a topic found usable, the error describe returned for one found missing,
// or driver.ErrTopicPending while a lookup is under way. A topic found usable is not asked about
// again; one found missing is asked about again once recheck has passed.
//
// The lookup runs in the background and Check returns ErrTopicPending meanwhile: Produce, which
// calls Check, must not block, and a metadata request can take seconds on a slow broker, which
// would hold up commits and the end of an epoch. Check must not be called after Close.
func (c *Checker) Check(topic string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, known := c.topics[topic]
	switch {
	case known && st.pending:
		return driver.ErrTopicPending
	case known && (st.err == nil || time.Since(st.at) < c.recheck):
		return st.err
	}
	c.topics[topic] = state{pending: true}
	c.lookups.Go(func() { c.lookUp(topic) })
	return driver.ErrTopicPending
}

// lookUp asks about a topic and records what it learnt. A topic found missing is asked about
// again, at growing intervals, until createWait has passed or the Checker closes.
func (c *Checker) lookUp(topic string) {
	st := c.ask(topic)
	giveUp := time.Now().Add(c.createWait)
	for wait := firstRetry; st.err != nil && time.Now().Add(wait).Before(giveUp); wait *= 2 {
		select {
		case <-c.closing:
			giveUp = time.Time{} // keep what was learnt; the producer is going away
		case <-time.After(wait):
			st = c.ask(topic)
		}
	}
	c.mu.Lock()
	c.topics[topic] = st
	c.mu.Unlock()
}

// ask calls describe once and notes when it answered, from which recheck is counted.
func (c *Checker) ask(topic string) state {
	err := c.describe(topic)
	return state{err: err, at: time.Now()}
}

// Close stops lookups waiting for a topic to appear and waits for them to end; a describe under
// way is not interrupted here (the driver bounds it). The driver calls it before it closes the
// client describe uses.
func (c *Checker) Close() {
	close(c.closing)
	c.lookups.Wait()
}
