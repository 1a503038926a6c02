package reaper_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/internal/testkit/verifytest"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// loadOutboxes is how many outboxes TestReaperManyOutboxesUnderLoadWithFaults runs in one
// reaper, over loadDatabases databases of one Postgres cluster.
const (
	loadOutboxes  = 20
	loadDatabases = 3
	loadKeys      = 5 // keys each writer writes, one record of each per batch, unless told
)

// loadWriter writes batches of stamped records (one per key, the next sequence number) into one
// outbox until stopped; a batch the database refuses (it is down, or the table altered) is
// written again, so that what was committed is always sequences 0 to n-1 of every key.
type loadWriter struct {
	o        testOutbox
	run      string
	keys     int
	verifier *verifytest.Verifier
	stop     chan struct{}
	done     chan struct{}
	batches  int64 // committed; read after done
}

func startLoadWriter(t *testing.T, broker *kafkacluster.Cluster, o testOutbox, run string, keys int) *loadWriter {
	w := &loadWriter{o: o, run: run, keys: keys, stop: make(chan struct{}), done: make(chan struct{})}
	w.verifier = verifytest.Start(t, broker.Addr(), o.topic, run)
	st, err := stasher.New(o.table)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		defer close(w.done)
		// The pace is the load's, not a wait for a condition: 4 batches a second (with 5 keys,
		// 20 records a second per outbox, 400 in all with 20 outboxes).
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			records := make([]outbox.Record, keys)
			for k := range keys {
				records[k] = verify.Record(o.topic, "key-"+strconv.Itoa(k), run, w.batches, goharvest.String("v"))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := st.StashPgx(ctx, o.pool, records...); err == nil {
				w.batches++
			}
			cancel()
		}
	}()
	t.Cleanup(w.halt)
	return w
}

// halt stops the writer and waits for it; calling it again does nothing.
func (w *loadWriter) halt() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// expected is what the writer committed, per key; only after halt.
func (w *loadWriter) expected() map[string]int64 {
	m := make(map[string]int64, w.keys)
	for k := range w.keys {
		m["key-"+strconv.Itoa(k)] = w.batches
	}
	return m
}

// outboxesFile writes a reaper file of the outboxes in entries (a YAML list's items) on broker,
// with short timings, harvest's other settings (indented lines) and its admin endpoints at
// addr, and returns its path.
func outboxesFile(t *testing.T, broker *kafkacluster.Cluster, name, harvest, entries, addr string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(path, []byte(`harvest:
  baseKafkaConfig:
    bootstrap.servers: `+broker.Addr()+`
`+harvest+`  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
    ioErrorBackoff: 200ms
outboxes:
`+entries+`admin:
  address: `+addr+`
`), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// unready returns the outboxes /readyz names, sorted, and its answer.
func unready(base string) ([]string, int, string) {
	code, body := get(base + reaper.ReadyzPath)
	var names []string
	for line := range strings.Lines(body) {
		if rest, ok := strings.CutPrefix(line, "outbox "); ok {
			if name, _, ok := strings.Cut(rest, ":"); ok {
				names = append(names, name)
			}
		}
	}
	slices.Sort(names)
	return names, code, body
}

// waitUnready waits until /readyz answers 503 naming exactly want.
func waitUnready(t *testing.T, base string, want []string, within time.Duration) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	eventually(t, fmt.Sprintf("/readyz naming exactly %v", want), within, func() (bool, string) {
		names, code, body := unready(base)
		if len(want) == 0 {
			return code == 200, body
		}
		return code == 503 && slices.Equal(names, want), body
	})
	if len(want) > 0 {
		_, _, body := unready(base)
		t.Logf("/readyz: %s", body)
	}
}

// waitProgress waits until every writer not in held has had at least 2 more batches of
// records arrive than when called: the healthy outboxes publish while the others are held back.
func waitProgress(t *testing.T, writers []*loadWriter, held []string, within time.Duration) {
	t.Helper()
	since := make([]int64, len(writers))
	for i, w := range writers {
		since[i] = w.verifier.Distinct()
	}
	eventually(t, "every other outbox publishing", within, func() (bool, string) {
		for i, w := range writers {
			if slices.Contains(held, w.o.name) {
				continue
			}
			if d := w.verifier.Distinct(); d < since[i]+2*int64(w.keys) {
				return false, fmt.Sprintf("outbox %s: %d records arrived since, want %d", w.o.name, d-since[i], 2*w.keys)
			}
		}
		return true, ""
	})
}

// written returns, for each outbox named in names, the sum of its topic's high watermarks:
// what reached Kafka, whether or not the verifier has consumed it yet.
func written(t *testing.T, cons *kafka.Consumer, writers []*loadWriter, names []string) map[string]int64 {
	t.Helper()
	m := map[string]int64{}
	for _, w := range writers {
		if !slices.Contains(names, w.o.name) {
			continue
		}
		for p := range int32(2) {
			_, high, err := cons.QueryWatermarkOffsets(w.o.topic, p, 10000)
			if err != nil {
				t.Fatal(err)
			}
			m[w.o.name] += high
		}
	}
	return m
}

// 20 outboxes over 3 databases of one Postgres cluster, in one reaper, under a writer each; three
// faults in turn, each holding back only its own outboxes while the others publish, and /readyz
// naming exactly those: a database that refuses connections (ALTER DATABASE ... ALLOW_CONNECTIONS
// false and its backends terminated, which the reaper sees as a database that is down: it cannot
// connect), and an outbox table whose kafka_value became text[], which the reaper cannot read.
// The
// third fault, a topic without WRITE, needs a broker with ACLs, and is
// TestReaperOutboxWithoutTopicWriteHoldsBackOnlyItself. Each fault undone, the held outboxes
// catch up; at the end every outbox has every record its writer committed, in order per key.
func TestReaperManyOutboxesUnderLoadWithFaults(t *testing.T) {
	broker := kafkacluster.Shared(t)
	ctx := context.Background()
	dsns := make([]string, loadDatabases)
	pools := make([]*pgxpool.Pool, loadDatabases)
	dbNames := make([]string, loadDatabases)
	for i := range dsns {
		dsns[i] = pgtest.NewDatabase(t)
		pools[i] = newPool(t, dsns[i])
		if err := pools[i].QueryRow(ctx, "SELECT current_database()").Scan(&dbNames[i]); err != nil {
			t.Fatal(err)
		}
	}
	// Database 0 holds 2 outboxes, the one stopped; the rest share databases 1 and 2.
	dbOf := func(i int) int {
		if i < 2 {
			return 0
		}
		return 1 + i%(loadDatabases-1)
	}
	outboxes := make([]testOutbox, loadOutboxes)
	var yaml strings.Builder
	for i := range outboxes {
		name := fmt.Sprintf("ob%02d", i)
		outboxes[i] = testOutbox{name: name, table: "outbox_" + name, topic: broker.Topic(t, "load."+name, 2), pool: pools[dbOf(i)]}
		fmt.Fprintf(&yaml, "  - outbox: %s\n    leaderGroupID: load-%s\n    dataSource: %q\n    outboxTable: %s\n",
			name, name, dsns[dbOf(i)], outboxes[i].table)
	}
	addr := freeAddr(t)
	config := outboxesFile(t, broker, "reaper", "", yaml.String(), addr)
	var out strings.Builder
	if code := reaper.Main([]string{"init", "-f", config}, reaper.Env{Stdout: &out, Stderr: &out, LookupEnv: os.LookupEnv, Context: ctx}); code != 0 ||
		strings.Count(out.String(), "is ready") != loadOutboxes {
		t.Fatalf("init: exit %d:\n%s", code, out.String())
	}

	start := time.Now()
	run := startReaperRun(t, config)
	var stalled []string // outboxes whose records did not all arrive
	defer func() {
		if t.Failed() {
			// The log lines of the outboxes at fault, which would drown in the others'.
			var lines []string
			for line := range strings.Lines(run.logs.String()) {
				if strings.Contains(line, "ob00") || strings.Contains(line, "ob03") || !strings.Contains(line, "outbox=") ||
					slices.ContainsFunc(stalled, func(name string) bool { return strings.Contains(line, name) }) {
					lines = append(lines, line)
				}
			}
			t.Logf("reaper log, outboxes ob00, ob03 and %v:\n%s", stalled, strings.Join(lines[max(0, len(lines)-400):], ""))
		}
	}()
	writers := make([]*loadWriter, loadOutboxes)
	for i, o := range outboxes {
		writers[i] = startLoadWriter(t, broker, o, t.Name(), loadKeys)
	}
	base := "http://" + addr
	waitUnready(t, base, nil, time.Minute)
	waitProgress(t, writers, nil, time.Minute)
	t.Logf("%d outboxes publishing after %v", loadOutboxes, time.Since(start).Round(time.Millisecond))

	cons, err := kafka.NewConsumer(&kafka.ConfigMap{"bootstrap.servers": broker.Addr(), "group.id": "load-watermarks"})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	// fault holds back the outboxes named held with do, checks that only they are held back, and
	// undoes it with undo.
	fault := func(what string, held []string, do, undo func()) {
		t.Helper()
		began := time.Now()
		do()
		waitUnready(t, base, held, time.Minute)
		// What the held outboxes had read before the fault may still reach Kafka for a while
		// (seconds, on a loaded machine); then their topics must stop growing: unchanged over
		// a round in which every other outbox publishes.
		var before, after map[string]int64
		if !testwait.Until(90*time.Second, func() bool {
			before = written(t, cons, writers, held)
			waitProgress(t, writers, held, time.Minute)
			after = written(t, cons, writers, held)
			return maps.Equal(before, after)
		}) {
			t.Errorf("%s: the held outboxes' topics kept growing while held back: %v, then %v", what, before, after)
		}
		undo()
		waitUnready(t, base, nil, time.Minute)
		waitProgress(t, writers, nil, time.Minute)
		t.Logf("%s: held back %v alone, and undone, in %v", what, held, time.Since(began).Round(time.Millisecond))
	}
	exec := func(pool *pgxpool.Pool, sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	// (a) Database 0 refuses connections: the two outboxes in it are held back.
	fault("database 0 down", []string{outboxes[0].name, outboxes[1].name}, func() {
		exec(pools[1], "ALTER DATABASE "+dbNames[0]+" ALLOW_CONNECTIONS false")
		exec(pools[1], "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", dbNames[0])
	}, func() {
		exec(pools[1], "ALTER DATABASE "+dbNames[0]+" ALLOW_CONNECTIONS true")
	})

	// (b) One outbox's kafka_value becomes text[], a type the harvester cannot read (pgx
	// refuses to scan text[] as bytes, on old connections and new), and only it is held back
	// (another outbox in the same database goes on). Its writer cannot write text into it
	// either, so the same transaction as the ALTER writes rows of another run first: with none
	// in the table, the harvester would have nothing to read, nothing would fail, and /readyz
	// would rightly stay ok. text[] keeps every value, so undoing it loses nothing.
	altered := outboxes[3]
	fault("table "+altered.table+" unreadable", []string{altered.name}, func() {
		records, _ := verify.Backlog(altered.topic, t.Name()+".unread", loadKeys, 1, goharvest.String("v"))
		st, err := stasher.New(altered.table)
		if err != nil {
			t.Fatal(err)
		}
		if err := pgx.BeginFunc(ctx, altered.pool, func(tx pgx.Tx) error {
			if err := st.StashPgx(ctx, tx, records...); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "ALTER TABLE "+altered.table+" ALTER COLUMN kafka_value TYPE text[] USING ARRAY[kafka_value]")
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}, func() {
		exec(altered.pool, "ALTER TABLE "+altered.table+" ALTER COLUMN kafka_value TYPE text USING kafka_value[1]")
	})

	for _, w := range writers {
		w.halt()
	}
	for _, w := range writers {
		want := w.expected()
		if !testwait.Until(2*time.Minute, func() bool { return w.verifier.Distinct() >= w.batches*int64(w.keys) }) {
			// Whether the harvester or the consumer stalled: the rows left, the topic's end.
			var rows int
			w.o.pool.QueryRow(ctx, "SELECT count(*) FROM "+w.o.table).Scan(&rows)
			_, ready := get(base + reaper.ReadyzPath + "?outbox=" + w.o.name)
			_, shards := get(base + reaper.ShardsPath + "?outbox=" + w.o.name)
			t.Errorf("outbox %s: %d of %d records arrived within 2m; %d rows left in its table, its topic's end %v; readyz %q, shards %s",
				w.o.name, w.verifier.Distinct(), w.batches*int64(w.keys), rows, written(t, cons, writers, []string{w.o.name}), ready, shards)
			stalled = append(stalled, w.o.name)
		}
		if report := w.verifier.Report(want); !report.OK() {
			t.Errorf("outbox %s:\n%s", w.o.name, report)
		}
	}
	var total int64
	for _, w := range writers {
		total += w.batches * int64(w.keys)
	}
	t.Logf("%d records over %d outboxes, in %v", total, loadOutboxes, time.Since(start).Round(time.Millisecond))
	if code := run.stop(t); code != 0 {
		t.Errorf("the reaper exited %d", code)
	}
}
