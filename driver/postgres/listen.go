package postgres

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/wakegrid"
)

// Listen implements Listener: ListenCovering without its reports.
func (b *Store) Listen(ctx context.Context, wake func()) error {
	return b.ListenCovering(ctx, wake, func(bool) {})
}

// ListenCovering implements CoveringListener. A Store and its shards' views (see Shard) share one
// listening connection: a notification says nothing of the shard its rows are in, so each view
// would hear every one anyway, and a connection of each would have Postgres deliver every writer's
// notification once per shard led. The connection opens for the first caller and closes when the
// last one returns; each caller hears every notification, is told at once that the connection
// listens (and whether it covers) if it joins one already heard, and returns the connection's
// error when it fails. wake and covered are called under the connection's lock, so they must
// return promptly (the harvester's only signal a goroutine).
func (b *Store) ListenCovering(ctx context.Context, wake func(), covered func(bool)) error {
	sub := &listenSub{wake: wake, covered: covered, end: make(chan error, 1)}
	c := b.hub.join(b, sub)
	defer b.hub.leave(c, sub)
	select {
	case <-ctx.Done():
		return nil
	case err := <-sub.end:
		return err
	}
}

// listenHub is the listening connection that a Store and its views share (see ListenCovering).
type listenHub struct {
	mu  sync.Mutex
	cur *hubConn // the connection serving callers, nil while none is
}

// hubConn is one listening connection and the callers it serves. Its fields are guarded by the
// hub's mu.
type hubConn struct {
	cancel  context.CancelFunc
	closed  chan struct{} // closed once the connection is closed
	subs    map[*listenSub]struct{}
	heard   bool // it has heard a notification, so that a caller that joins looks at once
	covered bool // what it last reported
}

// listenSub is one caller of ListenCovering.
type listenSub struct {
	wake    func()
	covered func(bool)
	end     chan error // the connection's end, if it ends before the caller leaves
}

// join adds sub to the hub's connection, opening one if none serves.
func (h *listenHub) join(b *Store, sub *listenSub) *hubConn {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.cur
	if c == nil {
		ctx, cancel := context.WithCancel(context.Background())
		c = &hubConn{cancel: cancel, closed: make(chan struct{}), subs: map[*listenSub]struct{}{}}
		h.cur = c
		go h.serve(ctx, b, c)
	}
	c.subs[sub] = struct{}{}
	if c.heard {
		sub.covered(c.covered)
		sub.wake()
	}
	return c
}

// leave takes sub off c, telling it that it no longer covers; the last caller to leave closes the
// connection, and returns once it is closed.
func (h *listenHub) leave(c *hubConn, sub *listenSub) {
	h.mu.Lock()
	_, was := c.subs[sub]
	delete(c.subs, sub)
	last := was && len(c.subs) == 0 && h.cur == c
	if last {
		h.cur = nil
		c.cancel()
	}
	h.mu.Unlock()
	sub.covered(false)
	if last {
		<-c.closed
	}
}

// serve listens for c's callers until its context ends (its last caller left) or the connection
// fails, when each caller still there is given the error.
func (h *listenHub) serve(ctx context.Context, b *Store, c *hubConn) {
	each := func(f func(*listenSub)) {
		for sub := range c.subs {
			f(sub)
		}
	}
	err := b.listenConn(ctx, func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		c.heard = true
		each(func(s *listenSub) { s.wake() })
	}, func(covered bool) {
		h.mu.Lock()
		defer h.mu.Unlock()
		c.covered = covered
		each(func(s *listenSub) { s.covered(covered) })
	})
	close(c.closed)
	if ctx.Err() != nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cur == c {
		h.cur = nil
	}
	each(func(s *listenSub) { s.end <- err })
	c.subs = nil
}

// listenConn is ListenCovering on a connection of its own (to the listen data source, see
// WithListenDataSource), outside the pool, which it closes on return. It returns nil when ctx is
// done, and an error when the connection fails.
//
// A LISTEN can succeed and still hear nothing: through a pooler in transaction mode the session
// that ran it goes back to the pool as soon as it ends, and the pooler drops what the server
// sends it later. So once listening, it sends a notification on its channel from the pool,
// another connection, and waits up to the probe timeout for any notification to arrive. If none
// does, it returns an error wrapping ErrNotificationsLost. (Checking that the backend's process
// ID stays the same across transactions would not do: a pooler with little to do often hands
// the same server connection back, and the check would pass until it did not.)
//
// Heard, it reports its notifications covering when the table has a trigger that notifies on
// insert (see coverSQL), and asks that again, on its own connection, once no notification has
// come for about listenCheckInterval (at most that; on the process's wake grid): the answer is
// also the proof that the connection still works, which a connection cut without a word (no
// FIN, no RST) would otherwise hide for as long as TCP's keepalives take. Without such a trigger
// (a writer that notifies by hand, say) the wake-ups still come, but the harvester polls too.
func (b *Store) listenConn(ctx context.Context, wake func(), covered func(bool)) error {
	conn, err := pgx.ConnectConfig(ctx, b.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: connect: %w", b.channel, err)
	}
	defer conn.Close(context.Background())
	defer covered(false)
	defer b.answeredAt(time.Time{})
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{b.channel}.Sanitize()); err != nil {
		return fmt.Errorf("listen on %s: %w", b.channel, err)
	}
	if _, err := b.pool.Exec(ctx, "SELECT pg_notify($1, $2)", b.channel, "goharvest probe "+uuid.NewString()); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("listen on %s: send a test notification: %w", b.channel, err)
	}
	// Any notification proves that they arrive, the probe's or a writer's.
	probeCtx, cancel := context.WithTimeout(ctx, b.probe)
	_, err = conn.WaitForNotification(probeCtx)
	timedOut := err != nil && probeCtx.Err() != nil
	cancel()
	switch {
	case ctx.Err() != nil:
		return nil
	case timedOut:
		return fmt.Errorf("listen on %s as %s: a test notification did not arrive within %v (is the listen data source a pooler in transaction mode?): %w",
			b.channel, describeConn(b.listen), b.probe, driver.ErrNotificationsLost)
	case err != nil:
		return fmt.Errorf("listen on %s: %w", b.channel, err)
	}
	// check asks on the listening connection whether the table's trigger notifies on insert.
	check := func() error {
		checkCtx, cancel := context.WithTimeout(ctx, b.probe)
		defer cancel()
		var notifies bool
		if err := conn.QueryRow(checkCtx, coverSQL, b.table, b.channel).Scan(&notifies); err != nil {
			return fmt.Errorf("listen on %s: check the connection and the notification trigger: %w", b.channel, err)
		}
		covered(notifies)
		b.answeredAt(time.Now())
		return nil
	}
	if err := check(); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	// Listening, and heard: records written before the LISTEN took effect sent their
	// notifications to nobody, so look now.
	wake()
	// A check is due at the next point of the process's wake grid, so that a reaper's idle
	// listeners check together; after a notification, at the last whole second of the grid
	// within listenCheckInterval, so that a busy connection is not checked.
	due := wakegrid.Next(time.Now(), listenCheckInterval)
	for {
		waitCtx, cancel := context.WithDeadline(ctx, due)
		_, err := conn.WaitForNotification(waitCtx)
		quiet := err != nil && waitCtx.Err() != nil && ctx.Err() == nil
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case quiet:
			err = check()
			due = wakegrid.Next(time.Now(), listenCheckInterval)
		case err == nil:
			b.answeredAt(time.Time{}) // no longer idle: pings go through the pool again
			wake()
			due = wakegrid.Next(time.Now().Add(listenCheckInterval-time.Second), time.Second)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("listen on %s: %w", b.channel, err)
		}
	}
}

// listenCheckInterval is how long a listening connection waits for a notification before it asks
// again whether the table notifies (see ListenCovering), which also proves that the connection
// still answers. A connection cut without a word is found within this and the probe timeout.
const listenCheckInterval = 10 * time.Second

// coverSQL says whether the table ($1) has an enabled trigger that fires on INSERT, whose function
// calls pg_notify and which names the channel ($2), as an argument (as the trigger of
// outbox.TableDDL does) or in the function's body.
const coverSQL = `SELECT EXISTS (SELECT 1 FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
  WHERE t.tgrelid = $1::regclass AND NOT t.tgisinternal AND t.tgenabled IN ('O', 'A') AND t.tgtype & 4 <> 0
    AND p.prosrc LIKE '%pg_notify%' AND (position(convert_to($2, 'UTF8') IN t.tgargs) > 0 OR strpos(p.prosrc, $2) > 0))`

// describeConn names where a connection goes, without its password, for logs.
func describeConn(c *pgx.ConnConfig) string {
	return fmt.Sprintf("%s@%s:%d/%s", c.User, c.Host, c.Port, c.Database)
}

// Ping checks that the database answers: through the pool, unless the binding's idle listening
// connection, which goes the pool's way, answered its last check (see ListenCovering) within
// listenCheckInterval and the probe timeout. An idle outbox's readiness probes then take no pool
// connection, which its pool would otherwise keep open for them alone; a database cut off
// without a word is noticed within that time rather than at once (one that closes its
// connections, at once).
func (b *Store) Ping(ctx context.Context) error {
	if b.answered != nil {
		if t := b.answered.Load(); t != 0 && time.Since(time.Unix(0, t)) < listenCheckInterval+b.probe {
			return nil
		}
	}
	return b.pool.Ping(ctx)
}

// answeredAt records when the idle listening connection answered; the zero time, that it no
// longer stands for the pool.
func (b *Store) answeredAt(t time.Time) {
	if b.answered == nil {
		return
	}
	if t.IsZero() {
		b.answered.Store(0)
		return
	}
	b.answered.Store(t.UnixNano())
}
