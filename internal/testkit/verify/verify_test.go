package verify

import (
	"strings"
	"testing"
	"time"
)

func stamp(run string, seq int64, written time.Time) Stamp {
	return Stamp{Run: run, Seq: seq, Written: written}
}

func TestCheckerAcceptsOrderAndImmediateRepeats(t *testing.T) {
	c := NewChecker("r")
	t0 := time.Unix(100, 0)
	for i, seq := range []int64{0, 1, 1, 2, 3, 3, 4} {
		c.Observe("a", stamp("r", seq, t0), t0.Add(time.Duration(i+1)*time.Millisecond))
	}
	c.Observe("b", stamp("r", 0, t0), t0.Add(10*time.Millisecond))
	if c.Observe("a", stamp("other-run", 0, t0), t0) {
		t.Fatal("a record of another run was counted")
	}
	r := c.Report(map[string]int64{"a": 5, "b": 1})
	if !r.OK() || r.Duplicates != 2 || r.Distinct != 6 || r.Messages != 8 || r.Expected != 6 {
		t.Fatalf("report %+v\n%s", r, r)
	}
	if r.Max != 10*time.Millisecond || r.P50 != 5*time.Millisecond {
		t.Fatalf("latencies p50 %v max %v", r.P50, r.Max)
	}
	if !strings.Contains(r.String(), "verdict: OK") {
		t.Fatalf("verdict %q", r)
	}
}

func TestCheckerCatchesLossAndReversal(t *testing.T) {
	c := NewChecker("r")
	now := time.Now()
	for _, seq := range []int64{0, 1, 2, 1, 2, 3} { // 1 after 2: the sequence went backwards
		c.Observe("a", stamp("r", seq, now), now)
	}
	for _, seq := range []int64{0, 3, 4, 7} { // 1, 2, 5 and 6 never arrive
		c.Observe("b", stamp("r", seq, now), now)
	}
	r := c.Report(map[string]int64{"a": 4, "b": 8, "c": 2})
	if r.OK() {
		t.Fatal("a loss and a reversal passed")
	}
	if len(r.Reversals) != 1 || r.Reversals[0].Key != "a" || r.Reversals[0].Seq != 1 || r.Reversals[0].AfterSeq != 2 {
		t.Fatalf("reversals %v", r.Reversals)
	}
	if r.LostCount != 6 {
		t.Fatalf("lost %d, want 6 (b: 1, 2, 5, 6; c: 0, 1)", r.LostCount)
	}
	out := r.String()
	for _, want := range []string{"key b: 1-2, 5-6", "key c: 0-1", "key a: 1 arrived after 2", "verdict: FAILED"} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks %q:\n%s", want, out)
		}
	}
}

func TestRecordAndParseRoundTrip(t *testing.T) {
	rec := Record("t", "k", "run-1", 42, nil)
	headers := map[string]string{}
	for _, h := range rec.KafkaHeaders {
		headers[h.Key] = h.Value
	}
	s, err := Parse(func(name string) (string, bool) { v, ok := headers[name]; return v, ok })
	if err != nil || s.Run != "run-1" || s.Seq != 42 || time.Since(s.Written) > time.Minute {
		t.Fatalf("parsed %+v, %v", s, err)
	}
	if _, err := Parse(func(string) (string, bool) { return "", false }); err == nil {
		t.Fatal("a message without a stamp parsed")
	}
}

func TestDedupByID(t *testing.T) {
	at := func(seq int64, written int64) Stamp { return Stamp{Run: "r", Seq: seq, Written: time.Unix(0, written)} }
	got := DedupByID([]Message{
		{Key: "a", Stamp: at(0, 1), ID: "1"},
		{Key: "a", Stamp: at(0, 1), ID: "1"}, // a repeat: removed
		{Key: "a", Stamp: at(1, 2), ID: "2"},
		{Key: "a", Stamp: at(1, 2), ID: "7"}, // the same row under another id: passed
		{Key: "a", Stamp: at(2, 3), ID: "3"},
		{Key: "a", Stamp: at(2, 4), ID: "4"}, // a writer's second row for seq 2: rewritten
		{Key: "b", Stamp: at(0, 5), ID: "3"}, // a new record with a reused id: skipped
	})
	if want := (Dedup{Removed: 1, Passed: 1, Rewritten: 1, Skipped: 1}); got != want {
		t.Fatalf("DedupByID = %+v, want %+v", got, want)
	}
}

func TestLatencyOfWrittenCountsOnlyTheWindow(t *testing.T) {
	c := NewChecker("r")
	t0 := time.Unix(100, 0)
	// Records written every second from t0, each taking as many seconds as its number to arrive.
	for seq := range int64(10) {
		written := t0.Add(time.Duration(seq) * time.Second)
		c.Observe("a", stamp("r", seq, written), written.Add(time.Duration(seq)*time.Second))
	}
	p99, most, n := c.LatencyOfWritten(t0.Add(2*time.Second), t0.Add(4*time.Second))
	if n != 3 || p99 != 4*time.Second || most != 4*time.Second {
		t.Fatalf("records written from +2s to +4s: p99 %v, most %v, of %d; want 4s, 4s, of 3", p99, most, n)
	}
	if _, _, n := c.LatencyOfWritten(t0.Add(20*time.Second), t0.Add(30*time.Second)); n != 0 {
		t.Fatalf("%d records in a window where none was written", n)
	}
}
