package int

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/internal/testkit/verify"
)

// An outbox column of a type the harvester cannot read is reported by name, nothing is
// published or dropped meanwhile, and once the table is altered the records flow.
func TestUnknownColumnType(t *testing.T) {
	r := newRig(t, rigOptions{})
	ctx := context.Background()
	if _, err := r.pool.Exec(ctx, "ALTER TABLE outbox ALTER COLUMN kafka_value TYPE xml USING NULL"); err != nil {
		t.Fatal(err)
	}
	const records = 50
	expected := map[string]int64{}
	for i := range records {
		key := "key-" + string(rune('a'+i%5))
		rec := verify.Record(r.topic, key, r.run, expected[key], nil)
		expected[key]++
		keys, values := []string{}, []string{}
		for _, h := range rec.KafkaHeaders {
			keys, values = append(keys, h.Key), append(values, h.Value)
		}
		_, err := r.pool.Exec(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			VALUES (now(), $1, $2, '<n>1</n>', $3, $4)`, rec.KafkaTopic, rec.KafkaKey, keys, values)
		if err != nil {
			t.Fatal(err)
		}
	}
	p := r.startReaper("a")
	var log []byte
	if !testwait.Until(30*time.Second, func() bool {
		log, _ = os.ReadFile(p.log.Name())
		return strings.Contains(string(log), "column kafka_value has type xml")
	}) {
		t.Fatalf("the unreadable column was not reported; log:\n%s", log)
	}
	// A stretch in which nothing may be published from the unreadable table.
	if !testwait.Throughout(time.Second, 50*time.Millisecond, func() bool { return r.rows() == records && r.distinct() == 0 }) {
		t.Fatalf("%d rows left and %d published while the table could not be read", r.rows(), r.distinct())
	}

	if _, err := r.pool.Exec(ctx, "ALTER TABLE outbox ALTER COLUMN kafka_value TYPE varchar(10000) USING kafka_value::text"); err != nil {
		t.Fatal(err)
	}
	r.v.WaitDistinct(t, records, time.Minute)
	testwait.For(t, time.Minute, "the outbox to empty", func() bool { return r.rows() == 0 })
	if report := r.v.Report(expected); !report.OK() {
		t.Fatalf("after the fix:\n%s", report)
	}
	log, _ = os.ReadFile(p.log.Name())
	if strings.Count(string(log), "the outbox table does not fit") != 1 {
		t.Errorf("the mismatch was reported %d times, want once", strings.Count(string(log), "the outbox table does not fit"))
	}
}
