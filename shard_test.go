package goharvest_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest"
	outboxpkg "github.com/goharvest/goharvest/outbox"
)

// Each shard's view marks exactly the rows whose keys outbox.Shard puts in it, oldest first:
// the Go function and the SQL expression agree, and together the shards cover the outbox.
func TestShardViewsMarkOnlyTheirRows(t *testing.T) {
	const shards = 8
	o := newOutbox(t, "outbox")
	o.stash(t, records(2000, func(i int) string { return fmt.Sprintf("key-%d-ü", i%300) })...)
	var all []int64
	for s := range shards {
		view := o.binding.Shard(s, shards)
		marked, err := view.Mark(context.Background(), uuid.New(), 5000)
		if err != nil {
			t.Fatal(err)
		}
		if len(marked) == 0 {
			t.Errorf("shard %d marked nothing", s)
		}
		for i, m := range marked {
			if got := outboxpkg.Shard([]byte(m.KafkaKey), shards); got != s {
				t.Fatalf("shard %d marked record %d of key %q, which outbox.Shard puts in shard %d", s, m.ID, m.KafkaKey, got)
			}
			if i > 0 && marked[i-1].ID > m.ID {
				t.Fatalf("shard %d marked out of id order", s)
			}
			all = append(all, m.ID)
		}
		view.Dispose() // a view's Dispose leaves the binding open
	}
	slices.Sort(all)
	if len(all) != 2000 || len(slices.Compact(all)) != 2000 {
		t.Fatalf("the shards marked %d records between them, want each of the 2000 once", len(all))
	}
	if _, err := o.binding.Mark(context.Background(), uuid.New(), 1); err != nil {
		t.Fatalf("the binding no longer works after its views were disposed: %v", err)
	}
}

func TestShardsConfig(t *testing.T) {
	for _, c := range []struct {
		shards int
		ok     bool
	}{{0, true}, {1, true}, {8, true}, {outboxpkg.MaxShards, true}, {-1, false}, {outboxpkg.MaxShards + 1, false}} {
		cfg := goharvest.Config{Shards: c.shards}.WithDefaults()
		err := cfg.Validate()
		if (err == nil) != c.ok {
			t.Errorf("Shards %d: Validate returned %v", c.shards, err)
		}
	}
	if got := goharvest.TransactionalID("app", 0, 1); got != "goharvest.app" {
		t.Errorf("one shard's transactional ID is %q, want it unchanged: goharvest.app", got)
	}
	if got := goharvest.TransactionalID("app", 3, 8); got != "goharvest.app.3" {
		t.Errorf("shard 3 of 8 has transactional ID %q, want goharvest.app.3", got)
	}
}
