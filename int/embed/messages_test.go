package embed_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// collector consumes a topic from the start, reading committed records only, until the test ends.
type collector struct {
	mu      sync.Mutex
	records []*kgo.Record
	changed chan struct{}
}

func collect(t *testing.T, addr string, topics ...string) *collector {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(addr, ",")...), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &collector{changed: make(chan struct{}, 1)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fetches := cl.PollFetches(ctx)
			c.mu.Lock()
			fetches.EachRecord(func(r *kgo.Record) { c.records = append(c.records, r) })
			c.mu.Unlock()
			select {
			case c.changed <- struct{}{}:
			default:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	return c
}

// await waits until ok holds for the records consumed so far, and returns them.
func (c *collector) await(t *testing.T, within time.Duration, what string, ok func([]*kgo.Record) bool) []*kgo.Record {
	t.Helper()
	deadline := time.After(within)
	for {
		c.mu.Lock()
		records := append([]*kgo.Record(nil), c.records...)
		c.mu.Unlock()
		if ok(records) {
			return records
		}
		select {
		case <-c.changed:
		case <-deadline:
			t.Fatalf("after %v, %d records consumed: still waiting for %s", within, len(records), what)
		}
	}
}

func (c *collector) awaitCount(t *testing.T, n int, within time.Duration) []*kgo.Record {
	t.Helper()
	return c.await(t, within, fmt.Sprintf("%d records", n), func(r []*kgo.Record) bool { return len(r) >= n })
}

// runHarvester runs h until the test calls the returned stop.
func runHarvester(t *testing.T, h *goharvest.Harvest) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	return func() {
		t.Helper()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func header(r *kgo.Record, key string) (string, bool) {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value), true
		}
	}
	return "", false
}

// partitionKeys returns n keys: the empty key and n-1 others.
func partitionKeys(n int) []string {
	keys := []string{""}
	for i := 1; i < n; i++ {
		keys = append(keys, fmt.Sprintf("customer-%d", i))
	}
	return keys
}

// By default every key lands where the Java client's default partitioner puts it (franz-go's
// StickyKeyPartitioner with its default hasher is that partitioner), the empty key included, with
// each Kafka client; a partitioner set in the configuration (librdkafka's only) is used instead.
func TestDefaultPartitionerMatchesJavaClient(t *testing.T) {
	cases := []struct {
		name        string
		client      reaper.KafkaClient
		partitioner string // "" for the default
	}{
		{"default/franz", reaper.KafkaClientFranz, ""},
		{"default/librdkafka", reaper.KafkaClientLibrdkafka, ""},
		{"consistent_random configured", reaper.KafkaClientLibrdkafka, "consistent_random"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			const partitions = 8
			r := newIntRig(t)
			keys := partitionKeys(1000)
			records := make([]goharvest.OutboxRecord, len(keys))
			for i, k := range keys {
				records[i] = goharvest.OutboxRecord{KafkaTopic: r.topic, KafkaKey: k, KafkaValue: goharvest.String("v")}
			}
			st, _ := stasher.New("outbox")
			if err := st.StashPgx(context.Background(), r.pool, records...); err != nil {
				t.Fatal(err)
			}
			consumed := collect(t, r.addr, r.topic)
			stop := runHarvester(t, r.harvesterWith("partition-int", goharvest.Limits{}, nil, func(cfg *harvestSettings) {
				cfg.KafkaClient = c.client
				if c.partitioner != "" {
					cfg.ProducerKafkaConfig = reaper.KafkaConfigMap{"partitioner": c.partitioner}
				}
			}))
			got := consumed.awaitCount(t, len(keys), 2*time.Minute)
			stop()

			java := kgo.StickyKeyPartitioner(nil).ForTopic(r.topic)
			var mismatched, emptyKeys int
			for _, m := range got {
				if m.Key == nil {
					t.Fatalf("a message arrived without a key (offset %d, partition %d)", m.Offset, m.Partition)
				}
				if len(m.Key) == 0 {
					emptyKeys++
				}
				if want := java.Partition(&kgo.Record{Key: append([]byte{}, m.Key...)}, partitions); int(m.Partition) != want {
					mismatched++
					if c.partitioner == "" {
						t.Errorf("key %q on partition %d; the Java client puts it on %d", m.Key, m.Partition, want)
					}
				}
			}
			if emptyKeys != 1 {
				t.Errorf("%d messages with the empty key, want 1", emptyKeys)
			}
			if c.partitioner != "" && mismatched == 0 {
				t.Errorf("with partitioner %s every key still landed where murmur2 puts it", c.partitioner)
			}
			t.Logf("%d of %d keys on another partition than the Java client's", mismatched, len(got))
		})
	}
}

// Zero bytes, invalid UTF-8 and Schema Registry framing in bytea columns, and JSON in json and
// jsonb columns, reach a consumer exactly; NULL values arrive as tombstones.
func TestPayloadFormatsReachConsumer(t *testing.T) {
	srFrame := "\x00\x00\x00\x01\x2c" + "\x02\x06abc\x00\xff" // magic byte 0, schema id 300, Avro-ish body
	cases := []struct {
		name    string
		setup   string // SQL run on the outbox first
		stasher []stasher.Option
		records []goharvest.OutboxRecord
		want    []*string // the values consumers should see, by record
	}{
		{
			name:    "bytea",
			setup:   `DROP TABLE outbox`, // recreated below with bytea columns
			stasher: []stasher.Option{stasher.ByteaColumns()},
			records: []goharvest.OutboxRecord{
				{KafkaKey: "zero\x00bytes", KafkaValue: goharvest.String("\x00\x00\x00"), KafkaHeaders: goharvest.KafkaHeaders{{Key: "bin", Value: "\x00\xff\xfe"}}},
				{KafkaKey: "\xff\xfeinvalid", KafkaValue: goharvest.String("\xc3\x28 not UTF-8 \xe2\x28\xa1")},
				{KafkaKey: "schema-registry", KafkaValue: goharvest.String(srFrame), KafkaHeaders: goharvest.KafkaHeaders{{Key: "esc", Value: `\x41 \\ "q"`}}},
				{KafkaKey: "tombstone", KafkaValue: nil},
				{KafkaKey: "", KafkaValue: goharvest.String("")},
			},
		},
		{
			name:    "jsonb",
			setup:   `ALTER TABLE outbox ALTER COLUMN kafka_value TYPE jsonb USING NULL`,
			stasher: []stasher.Option{stasher.JSONValue()},
			records: []goharvest.OutboxRecord{
				{KafkaKey: "a", KafkaValue: goharvest.String(`{"z": 1, "a": [true, null, "\u00e9"]}`)},
				{KafkaKey: "tombstone", KafkaValue: nil},
			},
			want: []*string{goharvest.String(`{"a": [true, null, "é"], "z": 1}`), nil},
		},
		{
			name:    "json",
			setup:   `ALTER TABLE outbox ALTER COLUMN kafka_value TYPE json USING NULL`,
			stasher: []stasher.Option{stasher.JSONValue()},
			records: []goharvest.OutboxRecord{{KafkaKey: "a", KafkaValue: goharvest.String(`{"z":1,  "a":"\u00e9"}`)}},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			r := newIntRig(t)
			if _, err := r.pool.Exec(ctx, c.setup); err != nil {
				t.Fatal(err)
			}
			if c.name == "bytea" {
				if err := postgres.CreateOutboxTable(ctx, r.dsn, "outbox", outbox.TableOptions{Bytea: true}); err != nil {
					t.Fatal(err)
				}
			}
			for i := range c.records {
				c.records[i].KafkaTopic = r.topic
			}
			st, err := stasher.New("outbox", c.stasher...)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.StashPgx(ctx, r.pool, c.records...); err != nil {
				t.Fatal(err)
			}
			ids := rowIDs(t, r)
			consumed := collect(t, r.addr, r.topic)
			stop := runHarvester(t, r.harvesterWith("payload-int", goharvest.Limits{}, nil, func(cfg *harvestSettings) {
				cfg.IDHeader = "goharvest-id"
			}))
			got := consumed.awaitCount(t, len(c.records), time.Minute)
			stop()
			byID := map[string]*kgo.Record{}
			for _, m := range got {
				id, _ := header(m, "goharvest-id")
				byID[id] = m
			}
			for i, rec := range c.records {
				m := byID[strconv.FormatInt(ids[i], 10)]
				if m == nil {
					t.Fatalf("record %d (id %d) not consumed", i, ids[i])
				}
				want := rec.KafkaValue
				if c.want != nil {
					want = c.want[i]
				}
				if !bytes.Equal(m.Key, []byte(rec.KafkaKey)) || m.Key == nil {
					t.Errorf("record %d: key %q, want %q", i, m.Key, rec.KafkaKey)
				}
				switch {
				case want == nil && m.Value != nil:
					t.Errorf("record %d: value %q, want a tombstone", i, m.Value)
				case want != nil && (m.Value == nil || !bytes.Equal(m.Value, []byte(*want))):
					t.Errorf("record %d: value %q, want %q", i, m.Value, *want)
				}
				if len(m.Headers) != len(rec.KafkaHeaders)+1 {
					t.Fatalf("record %d: headers %v, want %v and the id", i, m.Headers, rec.KafkaHeaders)
				}
				for j, h := range rec.KafkaHeaders {
					if m.Headers[j].Key != h.Key || !bytes.Equal(m.Headers[j].Value, []byte(h.Value)) {
						t.Errorf("record %d: header %d is %q=%q, want %q=%q", i, j, m.Headers[j].Key, m.Headers[j].Value, h.Key, h.Value)
					}
				}
			}
		})
	}
}

// rowIDs returns the outbox's ids in order.
func rowIDs(t *testing.T, r *intRig) []int64 {
	t.Helper()
	rows, err := r.pool.Query(context.Background(), "SELECT id FROM outbox ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// failedPurges is a Postgres binding whose purges all fail, as if the leader had stopped
// between each commit and its purge: every record it publishes is published again later.
type failedPurges struct{ *postgres.Store }

func (failedPurges) Purge(context.Context, []int64) (int, error) {
	return 0, errors.New("injected purge failure")
}

// With Config.IDHeader set, every message carries its row's id, and a record published again
// carries the same id, so consumers can drop the repeat.
func TestIDHeaderIsTheSameOnEveryPublish(t *testing.T) {
	const n = 50
	ctx := context.Background()
	r := newIntRig(t)
	records := make([]goharvest.OutboxRecord, n)
	for i := range records {
		records[i] = goharvest.OutboxRecord{KafkaTopic: r.topic, KafkaKey: fmt.Sprintf("k%d", i), KafkaValue: goharvest.String("v")}
	}
	st, _ := stasher.New("outbox")
	if err := st.StashPgx(ctx, r.pool, records...); err != nil {
		t.Fatal(err)
	}
	idOf := map[string]string{}
	for i, id := range rowIDs(t, r) {
		idOf[records[i].KafkaKey] = strconv.FormatInt(id, 10)
	}
	consumed := collect(t, r.addr, r.topic)
	withIDs := func(cfg *harvestSettings) { cfg.IDHeader = "goharvest-id" }
	limits := goharvest.Limits{IOErrorBackoff: 50 * time.Millisecond}

	stop := runHarvester(t, r.harvesterWith("id-int", limits, nil, withIDs, func(cfg *harvestSettings) {
		cfg.wrapStore = func(pg *postgres.Store) driver.DatabaseBinding { return failedPurges{pg} }
	}))
	consumed.awaitCount(t, n, time.Minute)
	stop()
	if left := r.outboxRows(); left != n {
		t.Fatalf("%d rows left after purges failed, want %d", left, n)
	}
	stop = runHarvester(t, r.harvesterWith("id-int", limits, nil, withIDs))
	r.waitEmpty(time.Minute)
	stop()
	got := consumed.await(t, time.Minute, "every record twice", func(got []*kgo.Record) bool {
		seen := map[string]int{}
		for _, m := range got {
			seen[string(m.Key)]++
		}
		for _, k := range records {
			if seen[k.KafkaKey] < 2 {
				return false
			}
		}
		return true
	})
	for _, m := range got {
		id, ok := header(m, "goharvest-id")
		if want := idOf[string(m.Key)]; !ok || id != want {
			t.Errorf("key %s at offset %d: id header %q (present %v), want %q", m.Key, m.Offset, id, ok, want)
		}
		if last := m.Headers[len(m.Headers)-1]; last.Key != "goharvest-id" {
			t.Errorf("the id header is not last: %v", m.Headers)
		}
	}
	t.Logf("%d messages for %d records", len(got), n)
}

// debeziumOutboxSQL is docs/messages.md's recipe: a Debezium-style outbox table, given the three
// columns goharvest needs (a bigint sequence to order by, a creation time, leader_id), and a
// view that shows it to goharvest under its own column names. The notification trigger goes on
// the table, where rows are inserted, and notifies the view's channel.
const debeziumOutboxSQL = `
CREATE TABLE outboxevent (
  id            UUID PRIMARY KEY DEFAULT gen_random_uuid(),
  aggregatetype VARCHAR(255) NOT NULL,
  aggregateid   VARCHAR(255) NOT NULL,
  type          VARCHAR(255) NOT NULL,
  payload       JSONB,
  -- added for goharvest:
  seq           BIGSERIAL NOT NULL UNIQUE,
  created_at    TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
  leader_id     UUID
) WITH (fillfactor = 80);

CREATE VIEW outboxevent_goharvest AS SELECT
  seq                                  AS id,
  created_at                           AS create_time,
  'outbox.event.' || aggregatetype     AS kafka_topic,
  aggregateid                          AS kafka_key,
  payload                              AS kafka_value,
  ARRAY['id', 'type']                  AS kafka_header_keys,
  ARRAY[id::text, type::text]          AS kafka_header_values,
  leader_id
FROM outboxevent;

CREATE OR REPLACE FUNCTION goharvest_notify() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify(TG_ARGV[0], '');
  RETURN NULL;
END
$fn$;
CREATE TRIGGER goharvest_notify AFTER INSERT ON outboxevent
  FOR EACH STATEMENT EXECUTE FUNCTION goharvest_notify('goharvest.outboxevent_goharvest');
`

// A Debezium-style outbox is harvested through a view that renames its columns: marks and
// purges go through the view to the table, every event arrives in order per aggregate with its
// id and type as headers, and an insert into the table wakes an idle harvester.
func TestDebeziumStyleTableThroughView(t *testing.T) {
	const aggregates, perAggregate = 20, 10
	ctx := context.Background()
	r := newIntRig(t)
	// The view names the topic from the aggregate type; the test's events go to it alone.
	if err := kafkacluster.Shared(t).CreateTopic("outbox.event.order", 8); err != nil {
		t.Fatal(err)
	}
	if _, err := r.pool.Exec(ctx, debeziumOutboxSQL); err != nil {
		t.Fatal(err)
	}
	insert := func(batch int) {
		for i := range perAggregate {
			for a := range aggregates {
				_, err := r.pool.Exec(ctx, `INSERT INTO outboxevent (aggregatetype, aggregateid, type, payload)
					VALUES ('order', $1, 'OrderUpdated', jsonb_build_object('batch', $2::int, 'n', $3::int))`,
					fmt.Sprintf("order-%d", a), batch, i)
				if err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	insert(1)
	consumed := collect(t, r.addr, "outbox.event.order")
	// Without a notification, an idle harvester would not look again for 50s.
	limits := goharvest.Limits{MarkBackoff: 50 * time.Second, MaxMarkBackoff: time.Minute}
	stop := runHarvester(t, r.harvesterWith("debezium-int", limits, nil, func(cfg *harvestSettings) {
		cfg.OutboxTable = "outboxevent_goharvest"
	}))
	defer func() {
		if stop != nil {
			stop()
		}
	}()
	consumed.awaitCount(t, aggregates*perAggregate, time.Minute)
	waitTableEmpty(t, r, "outboxevent", time.Minute)
	insert(2)
	got := consumed.awaitCount(t, 2*aggregates*perAggregate, 20*time.Second)
	waitTableEmpty(t, r, "outboxevent", time.Minute)
	stop()
	stop = nil

	last := map[string]int{}
	for _, m := range got {
		var batch, n int
		if _, err := fmt.Sscanf(string(m.Value), `{"n": %d, "batch": %d}`, &n, &batch); err != nil {
			t.Fatalf("value %q: %v", m.Value, err)
		}
		seq := batch*perAggregate + n
		if prev, ok := last[string(m.Key)]; ok && seq != prev+1 {
			t.Errorf("aggregate %s: event %d after %d", m.Key, seq, prev)
		}
		last[string(m.Key)] = seq
		id, _ := header(m, "id")
		typ, _ := header(m, "type")
		if len(id) != 36 || typ != "OrderUpdated" {
			t.Errorf("headers %v, want the event's uuid as id and its type", m.Headers)
		}
	}
	if len(got) != 2*aggregates*perAggregate || len(last) != aggregates {
		t.Errorf("%d events for %d aggregates, want %d for %d", len(got), len(last), 2*aggregates*perAggregate, aggregates)
	}
}

func waitTableEmpty(t *testing.T, r *intRig, table string, within time.Duration) {
	t.Helper()
	var n int
	if !testwait.Until(within, func() bool {
		if err := r.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 0
	}) {
		t.Fatalf("%d rows still in %s after %v", n, table, within)
	}
}
