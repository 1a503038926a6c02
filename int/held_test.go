package int

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/internal/testkit/verify"
)

// An operator's fix or delete of a held row takes effect without a restart, on a broker that
// creates no topics: a deleted row is never published, even once its topic appears; a fixed row's
// new content is what arrives, never its old (a malformed row's too); a key whose bad row has more rows behind it than
// the in-flight budget holds back only itself, and its order holds once the row is fixed.
func TestHeldRowsFixDeleteAndLateTopic(t *testing.T) {
	r := newRig(t, rigOptions{readCommitted: true,
		extraYAML: "    maxInFlightRecords: 100\n    heldCheckInterval: 200ms"})
	late := r.topic + ".late" // created only once the rows naming it are fixed or deleted
	ctx := context.Background()
	insert := func(topic, key string, value string, headerKeys, headerValues []string) int64 {
		var id int64
		if headerKeys == nil {
			headerKeys, headerValues = []string{}, []string{}
		}
		err := r.pool.QueryRow(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			VALUES (now(), $1, $2, $3, $4, $5) RETURNING id`, topic, key, value, headerKeys, headerValues).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	stamped := func(topicName, key string, seq int64) int64 {
		rec := verify.Record(topicName, key, r.run, seq, nil)
		var hk, hv []string
		for _, h := range rec.KafkaHeaders {
			hk, hv = append(hk, h.Key), append(hv, h.Value)
		}
		return insert(topicName, key, fmt.Sprint(seq), hk, hv)
	}
	// Key "many": a row with an invalid topic name, then more rows than maxInFlightRecords.
	const behind = 300
	badMany := stamped("bad topic!", "many", 0)
	for i := range behind {
		stamped(r.topic, "many", int64(i+1))
	}
	// Keys "del" and "fix": rows naming a topic that does not exist yet, each followed by another.
	deleted := insert(late, "del", "deleted", nil, nil)
	insert(late, "del", "after-delete", nil, nil)
	fixed := insert(late, "fix", "old", nil, nil)
	insert(late, "fix", "after-fix", nil, nil)
	// Key "hdr": a malformed row (header arrays of different lengths), then another.
	malformed := insert(late, "hdr", "malformed", []string{"a", "b"}, []string{"x"})
	insert(late, "hdr", "after-hdr", nil, nil)
	// Other keys, behind all of them.
	expected := map[string]int64{"many": behind + 1}
	for i := range 200 {
		key := fmt.Sprint("other-", i%20)
		stamped(r.topic, key, expected[key])
		expected[key]++
	}

	p := r.startReaper("a")
	waitLeader(t, 30*time.Second, p)
	r.v.WaitDistinct(t, 200, time.Minute) // the other keys flow past every held key

	if _, err := r.pool.Exec(ctx, "DELETE FROM outbox WHERE id = $1", deleted); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(ctx, "UPDATE outbox SET kafka_value = 'new' WHERE id = $1", fixed); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(ctx, "UPDATE outbox SET kafka_topic = $1 WHERE id = $2", r.topic, badMany); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(ctx, "UPDATE outbox SET kafka_header_values = '{x,y}', kafka_value = 'hdr-fixed' WHERE id = $1", malformed); err != nil {
		t.Fatal(err)
	}
	r.v.WaitDistinct(t, 200+behind+1, time.Minute) // fixed without a restart, and its key follows
	// Give the held loop time to see the fix and the delete while the topic is still missing, then
	// create it.
	time.Sleep(time.Second)
	r.kafka.Topic(t, late, 1)
	if !testwait.Until(2*time.Minute, func() bool { return r.rows() == 0 }) {
		t.Fatalf("%d rows left in the outbox", r.rows())
	}
	report := r.v.Report(expected)
	if !report.OK() {
		t.Errorf("delivery check failed:\n%s", report)
	}
	got := consumeAll(t, r.addr, late, 5)
	want := map[string][]string{"del": {"after-delete"}, "fix": {"new", "after-fix"}, "hdr": {"hdr-fixed", "after-hdr"}}
	for key, values := range want {
		if !slices.Equal(got[key], values) {
			t.Errorf("topic %s, key %s: got %q, want %q", late, key, got[key], values)
		}
	}
	figure(t, "held rows", "a bad row with %d rows of its key behind it (maxInFlightRecords 100) and 200 other records: the others published first; the bad row fixed, a held row deleted, another fixed and a malformed one fixed while their topic was missing, then the topic created: %v arrived on %s",
		behind, got, late)
}

// consumeAll reads n committed records from the start of a topic and returns their values by key.
func consumeAll(t *testing.T, addr, topicName string, n int) map[string][]string {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(addr, ",")...), kgo.ConsumeTopics(topicName),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got := map[string][]string{}
	count := 0
	for count < n && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(rec *kgo.Record) {
			got[string(rec.Key)] = append(got[string(rec.Key)], string(rec.Value))
			count++
		})
	}
	// Anything more (a deleted row, an old version) would arrive soon after.
	more, cancelMore := context.WithTimeout(context.Background(), time.Second)
	defer cancelMore()
	cl.PollFetches(more).EachRecord(func(rec *kgo.Record) {
		got[string(rec.Key)] = append(got[string(rec.Key)], string(rec.Value))
	})
	return got
}
