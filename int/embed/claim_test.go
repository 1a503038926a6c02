package embed_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/stasher"
)

// The read strategy keeps in memory what it has read rather than writing to rows,
// so these tests hold it to what a naive cursor (read the rows above the last id read) would
// break, on a real Postgres: a row whose transaction took a lower id and committed late, ids that
// rolled-back transactions burned, and a writing transaction left open.

// readClaims has a harvester claim by reading (ClaimRead, which these tests are about).
func readClaims(c *harvestSettings) { c.ClaimStrategy = goharvest.ClaimRead }

// stashIn writes one record of key with value in tx.
func stashIn(t *testing.T, tx pgx.Tx, topic, key, value string) {
	t.Helper()
	st, err := stasher.New("outbox")
	if err != nil {
		t.Fatal(err)
	}
	rec := goharvest.OutboxRecord{KafkaTopic: topic, KafkaKey: key, KafkaValue: goharvest.String(value)}
	if err := st.StashPgx(context.Background(), tx, rec); err != nil {
		t.Fatal(err)
	}
}

// begin opens a writing transaction, rolled back when the test ends unless committed first.
func (r *intRig) begin() pgx.Tx {
	r.t.Helper()
	tx, err := r.pool.Begin(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { tx.Rollback(context.Background()) })
	return tx
}

// write commits one record of key with value in a transaction of its own.
func (r *intRig) write(key, value string) {
	r.t.Helper()
	tx := r.begin()
	stashIn(r.t, tx, r.topic, key, value)
	if err := tx.Commit(context.Background()); err != nil {
		r.t.Fatal(err)
	}
}

func values(records []*kgo.Record) []string {
	var out []string
	for _, rec := range records {
		out = append(out, string(rec.Value))
	}
	return out
}

func hasValue(v string) func([]*kgo.Record) bool {
	return func(records []*kgo.Record) bool { return slices.Contains(values(records), v) }
}

// A row whose transaction took its id before higher ids were written, read and published, and
// that commits afterwards, is published: the read strategy finds it from the head of the table
// however late it commits, where a cursor above the last id read would skip it for ever.
func TestLateCommitWithALowerIDIsPublished(t *testing.T) {
	r := newIntRig(t)
	c := collect(t, r.addr, r.topic)
	late := r.begin()
	stashIn(t, late, r.topic, "late", "late") // takes the lower id, and stays open
	r.write("early", "early")
	stop := runHarvester(t, r.harvesterWith("late", goharvest.Limits{IOErrorBackoff: 50 * time.Millisecond}, nil, readClaims))
	defer stop()
	c.await(t, 30*time.Second, "the record committed first", hasValue("early"))
	r.write("after", "after")
	c.await(t, 30*time.Second, "a record written after it", hasValue("after"))
	if err := late.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	got := c.await(t, 30*time.Second, "the record that committed late", hasValue("late"))
	if n := len(got); n != 3 {
		t.Errorf("consumed %v, want the three records once each", values(got))
	}
}

// Ids that rolled-back transactions took leave gaps that nothing fills; the harvester never waits
// for them.
func TestRolledBackIDsStallNothing(t *testing.T) {
	r := newIntRig(t)
	c := collect(t, r.addr, r.topic)
	stop := runHarvester(t, r.harvesterWith("gaps", goharvest.Limits{IOErrorBackoff: 50 * time.Millisecond}, nil, readClaims))
	defer stop()
	for i := range 20 {
		gap := r.begin()
		for j := range 5 {
			stashIn(t, gap, r.topic, "gap", fmt.Sprint("rolled back ", i, j))
		}
		if err := gap.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
		r.write(fmt.Sprint("k", i%3), fmt.Sprint("kept ", i))
	}
	got := c.awaitCount(t, 20, 30*time.Second)
	for _, v := range values(got) {
		if strings.HasPrefix(v, "rolled back") {
			t.Errorf("a rolled-back record was published: %q", v)
		}
	}
}

// longTransaction is how long TestLongTransactionDelaysOnlyItsOwnRows keeps its transaction open:
// 15 s in make test, ten minutes under make chaos.
func longTransaction() time.Duration {
	if os.Getenv("GOHARVEST_CHAOS") != "" {
		return 10 * time.Minute
	}
	return 15 * time.Second
}

// A writing transaction held open delays only its own rows: every other key's records, written
// while it stays open, are published while it is still open (designs that read only below the
// oldest open transaction, pg_snapshot_xmin, publish none of them until it ends); its own row is
// published once it commits.
func TestLongTransactionDelaysOnlyItsOwnRows(t *testing.T) {
	hold := longTransaction()
	r := newIntRig(t)
	c := collect(t, r.addr, r.topic)
	long := r.begin()
	stashIn(t, long, r.topic, "long", "long")
	stop := runHarvester(t, r.harvesterWith("long", goharvest.Limits{IOErrorBackoff: 50 * time.Millisecond}, nil, readClaims))
	defer stop()
	// Once the harvester publishes (its election and first epoch take a few seconds on Kafka),
	// each record is awaited.
	r.write("warm-up", "warm-up")
	c.await(t, time.Minute, "the first record", hasValue("warm-up"))
	began, n, slowest := time.Now(), 0, time.Duration(0)
	pace := time.NewTicker(500 * time.Millisecond)
	defer pace.Stop()
	for ; time.Since(began) < hold; <-pace.C {
		v := fmt.Sprint("meanwhile ", n)
		r.write(fmt.Sprint("k", n%10), v)
		written := time.Now()
		// Arriving at all while the transaction is open is the property; how fast is a
		// benchmark's business on a shared machine.
		c.await(t, 30*time.Second, v+" while another transaction stayed open", hasValue(v))
		slowest = max(slowest, time.Since(written))
		n++
	}
	if slices.Contains(values(c.await(t, time.Second, "", func([]*kgo.Record) bool { return true })), "long") {
		t.Fatal("the open transaction's record was published before it committed")
	}
	if err := long.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.await(t, 30*time.Second, "the long transaction's record", hasValue("long"))
	t.Logf("%d records of other keys published while a transaction stayed open for %v, the slowest in %v", n, hold, slowest.Round(time.Millisecond))
}
