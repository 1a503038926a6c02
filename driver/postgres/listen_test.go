package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// The shards' views of one binding listen on one connection, so that Postgres delivers a writer's
// notification once rather than once per shard led: each view is woken when it starts listening
// and by every commit, and covered while the trigger is there; a view that joins later is told so
// at once; a view that stops leaves the others listening; a connection that fails ends every
// view's ListenCovering with its error, and the views listen again on a new one; the last view to
// stop closes it.
func TestShardViewsShareOneListeningConnection(t *testing.T) {
	const shards, app = 8, "goharvest-shared-listener-test"
	o := newOutbox(t, "outbox")
	ctx := context.Background()
	binding, err := postgres.New(o.dsn, "outbox", postgres.WithListenDataSource(o.dsn+" application_name="+app))
	if err != nil {
		t.Fatal(err)
	}
	defer binding.Dispose()
	listeners := func() int {
		t.Helper()
		var n int
		if err := o.pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	type view struct {
		cancel  context.CancelFunc
		wakes   chan struct{}
		covered chan bool
		done    chan error
	}
	listen := func(shard int) *view {
		ctx, cancel := context.WithCancel(ctx)
		v := &view{cancel: cancel, wakes: make(chan struct{}, 1), covered: make(chan bool, 16), done: make(chan error, 1)}
		sv := binding.Shard(shard, shards).(*postgres.Store)
		go func() {
			v.done <- sv.ListenCovering(ctx, func() {
				select {
				case v.wakes <- struct{}{}:
				default:
				}
			}, func(c bool) { v.covered <- c })
		}()
		return v
	}
	woken := func(v *view, shard int, what string) {
		t.Helper()
		select {
		case <-v.wakes:
		case <-time.After(5 * time.Second):
			t.Fatalf("shard %d's view not woken %s", shard, what)
		}
	}
	covers := func(v *view, shard int) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case c := <-v.covered:
				if c {
					return
				}
			case <-deadline:
				t.Fatalf("shard %d's view not told that it is covered", shard)
			}
		}
	}
	ended := func(v *view, shard int, wantErr bool) {
		t.Helper()
		select {
		case err := <-v.done:
			if (err != nil) != wantErr {
				t.Fatalf("shard %d's ListenCovering returned %v; want an error: %v", shard, err, wantErr)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("shard %d's ListenCovering did not return", shard)
		}
	}

	views := make([]*view, shards)
	for s := range views {
		views[s] = listen(s)
		woken(views[s], s, "once listening")
		covers(views[s], s)
	}
	if n := listeners(); n != 1 {
		t.Fatalf("%d listening connections for %d shards' views; want one", n, shards)
	}
	o.stash(t, records(1, func(int) string { return "k" })...)
	for s, v := range views {
		woken(v, s, "by a writer's commit")
	}

	views[0].cancel()
	ended(views[0], 0, false)
	o.stash(t, records(1, func(int) string { return "k" })...)
	for s, v := range views[1:] {
		woken(v, s+1, "after another shard's view stopped")
	}

	if _, err := o.pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", app); err != nil {
		t.Fatal(err)
	}
	for s, v := range views[1:] {
		ended(v, s+1, true)
	}
	again := []*view{listen(1), listen(2)}
	for i, v := range again {
		woken(v, i+1, "listening again")
		covers(v, i+1)
	}
	if n := listeners(); n != 1 {
		t.Fatalf("%d listening connections after the first failed; want one", n)
	}
	for i, v := range again {
		v.cancel()
		ended(v, i+1, false)
	}
	testwait.For(t, 5*time.Second, "the listening connection to close with its last view", func() bool { return listeners() == 0 })
}
