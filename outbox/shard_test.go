package outbox

import (
	"strconv"
	"testing"
)

func TestShardIsStable(t *testing.T) {
	// Fixed points: a change to the function would move every row to another shard, so these
	// values may never change. md5("hello") begins 5d41402; 0x5d41402 = 97784834.
	for _, c := range []struct {
		key    string
		shards int
		want   int
	}{
		{"hello", 1, 0},
		{"hello", 8, 97784834 % 8},
		{"hello", 256, 97784834 % 256},
		{"", 8, 0xd41d8cd % 8}, // md5("") begins d41d8cd
	} {
		if got := Shard([]byte(c.key), c.shards); got != c.want {
			t.Errorf("Shard(%q, %d) = %d, want %d", c.key, c.shards, got, c.want)
		}
	}
}

func TestShardSpreadsKeys(t *testing.T) {
	const shards, keys = 8, 8000
	counts := make([]int, shards)
	for i := range keys {
		counts[Shard([]byte("key-"+strconv.Itoa(i)), shards)]++
	}
	for s, n := range counts {
		if n < keys/shards*8/10 || n > keys/shards*12/10 {
			t.Errorf("shard %d has %d of %d keys: %v", s, n, keys, counts)
		}
	}
}
