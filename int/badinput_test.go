package int

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// Rows that cannot be published are reported by id, hold back only their own keys, and stay in
// the outbox; everything else flows, even behind a bad row followed by more rows of its key than
// maxInFlightRecords.
func TestBadInput(t *testing.T) {
	maxInFlight := pick(100, 500)
	r := newRig(t, rigOptions{extraYAML: fmt.Sprintf("    maxInFlightRecords: %d\n  producerKafkaConfig:\n    message.max.bytes: 4000", maxInFlight)})
	ctx := context.Background()
	insert := func(topic, key, value, headerKeys, headerValues string) int64 {
		var id int64
		err := r.pool.QueryRow(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			VALUES (now(), $1, $2, $3, $4::text[], $5::text[]) RETURNING id`, topic, key, value, headerKeys, headerValues).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	bad := map[string]int64{
		"invalid topic name":      insert("no such topic!", "bad-name", "v", "{}", "{}"),
		"missing topic":           insert("no-such-topic", "bad-topic", "v", "{}", "{}"),
		"oversize value":          insert(r.topic, "bad-size", strings.Repeat("x", 5000), "{}", "{}"),
		"mismatched header array": insert(r.topic, "bad-headers", "v", "{a,b}", "{x}"),
	}
	// A later record on each bad key must wait behind the bad one.
	for _, key := range []string{"bad-name", "bad-topic", "bad-size", "bad-headers"} {
		insert(r.topic, key, "next", "{}", "{}")
	}
	// And a bad row with more rows of its key behind it than the in-flight budget.
	behind := 3 * maxInFlight
	bad["invalid topic name, many rows behind"] = insert("no such topic!", "bad-many", "v", "{}", "{}")
	for range behind {
		insert(r.topic, "bad-many", "next", "{}", "{}")
	}
	held := 8 + 1 + behind
	r.startWriters(4, 1000, 2000)
	p := r.startReaper("a")
	waitLeader(t, 30*time.Second, p)
	r.waitProgress(pick[int64](3000, 20000), time.Minute)

	expected := r.w.stop()
	var total int64
	for _, n := range expected {
		total += n
	}
	r.v.WaitDistinct(t, total, 2*time.Minute)
	testwait.Until(time.Minute, func() bool { return r.rows() == held })
	if n := r.rows(); n != held {
		t.Fatalf("%d rows left in the outbox; want the %d bad rows and the %d held behind them", n, len(bad), held-len(bad))
	}
	report := r.v.Report(expected)
	if !report.OK() {
		t.Errorf("the good records suffered:\n%s", report)
	}
	log, _ := os.ReadFile(p.log.Name())
	for what, id := range bad {
		if !strings.Contains(string(log), fmt.Sprintf(`"id":%d`, id)) {
			t.Errorf("the %s (record %d) was not reported with its id", what, id)
		}
	}
	figure(t, "bad input", "bad rows %d (invalid topic name, missing topic, oversize value, mismatched headers, and an invalid topic name with %d rows of its key behind it, maxInFlightRecords %d), each reported by id and held with its key; other records %d, lost %d, reversals %d",
		len(bad), behind, maxInFlight, report.Expected, report.LostCount, len(report.Reversals))
}

// One leader drains a large backlog; its memory stays bounded by the in-flight limit, not by
// the backlog.
func TestLoad(t *testing.T) {
	records := pick(100_000, 1_000_000)
	r := newRig(t, rigOptions{heartbeatTimeout: 5 * time.Second})
	r.preload(records, 10_000)
	p := r.startReaper("a")
	start := time.Now()
	r.v.WaitDistinct(t, int64(records), 20*time.Minute)
	testwait.For(t, 20*time.Minute, "the outbox to empty", func() bool { return r.rows() == 0 })
	elapsed := time.Since(start)
	peak := peakRSS(t, p.cmd.Process.Pid)
	report := r.v.Report(r.preloaded)
	if !report.OK() {
		t.Errorf("delivery check failed:\n%s", report)
	}
	// The backlog is ~%d MB of rows; a harvester that held it would far exceed this.
	if peak > 256<<20 {
		t.Errorf("peak RSS %d MiB for a %d-record backlog; memory is not bounded by the in-flight limit", peak>>20, records)
	}
	figure(t, "load", "records %d through one leader in %v (%.0f records/s, including start-up and election); peak RSS %d MiB; duplicates %d, lost %d, reversals %d",
		records, elapsed.Round(time.Millisecond), float64(records)/elapsed.Seconds(), peak>>20, report.Duplicates, report.LostCount, len(report.Reversals))
}

// peakRSS reads a process's high-water resident set size from /proc.
func peakRSS(t *testing.T, pid int) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var kb int64
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), &kb)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}
