package goharvest_test

import (
	"testing"

	"github.com/goharvest/goharvest"
	outboxpkg "github.com/goharvest/goharvest/outbox"
)

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
