package mysql_test

import (
	"context"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/outbox"
)

// Each shard's view reads, marks and counts exactly the rows whose key outbox.Shard puts in it,
// text and binary keys alike, so that the harvester's shards and every writer agree; together
// the shards see every row once. A view's Dispose leaves the store usable.
func TestShardsSeeTheirOwnRows(t *testing.T) {
	ctx := context.Background()
	s, db := newStore(t)
	const shards = 4
	want := map[int][]int64{}
	for i := range 120 {
		key := "key-" + strconv.Itoa(i)
		if i%10 == 0 {
			key = string([]byte{0, byte(i), 0xff, 0xfe}) // not UTF-8
		}
		id := insert(t, db, "outbox", rec(key, "v"))
		shard := outbox.Shard([]byte(key), shards)
		want[shard] = append(want[shard], id)
	}
	var all []int64
	for shard := range shards {
		view := s.Shard(shard, shards)
		if offered(driver.FeaturesOf(view.(driver.Store))) != offered(driver.FeaturesOf(s)) {
			t.Errorf("shard %d's view offers other features than its store", shard)
		}
		recs, err := view.(driver.Reader).Read(ctx, 1000, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := idsOf(recs); !slices.Equal(got, want[shard]) {
			t.Errorf("shard %d read %v, want %v", shard, got, want[shard])
		}
		marked, err := view.Mark(ctx, uuid.New(), 1000)
		if err != nil {
			t.Fatal(err)
		}
		if got := idsOf(marked); !slices.Equal(got, want[shard]) {
			t.Errorf("shard %d marked %v, want %v", shard, got, want[shard])
		}
		if n, _, err := view.(driver.BacklogSampler).Backlog(ctx, 1000); err != nil || n != len(want[shard]) {
			t.Errorf("shard %d's backlog = %d, %v; want %d", shard, n, err, len(want[shard]))
		}
		view.Dispose()
		all = append(all, want[shard]...)
	}
	if len(all) != 120 || len(want) != shards {
		t.Errorf("the shards hold %d rows in %d shards, want 120 in %d", len(all), len(want), shards)
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("the store after its views were disposed of: %v", err)
	}
}

// offered names the features f has.
func offered(f driver.Features) string {
	var names []string
	v := reflect.ValueOf(f)
	for i := range v.NumField() {
		if !v.Field(i).IsNil() {
			names = append(names, v.Type().Field(i).Name)
		}
	}
	return strings.Join(names, " ")
}
