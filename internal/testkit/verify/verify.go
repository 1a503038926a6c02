// Package verify stamps outbox records so that what reaches Kafka can be checked, and checks
// it: every record arrived, no key went backwards (an immediate repeat is allowed, as at-least-
// once delivery permits), and how long records took from write to consumption.
package verify

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/goharvest/goharvest/outbox"
)

// Header names of a stamp.
const (
	HeaderRun     = "goharvest-run"     // identifies one load run, so older messages are ignored
	HeaderSeq     = "goharvest-seq"     // the record's position in its key's sequence, from 0
	HeaderWritten = "goharvest-written" // when the record was written (Unix nanoseconds)
)

// Stamp is what a checked record carries.
type Stamp struct {
	Run     string
	Seq     int64
	Written time.Time
}

// Record returns an outbox record stamped with run, seq and the current time.
func Record(topic, key, run string, seq int64, value *string) outbox.Record {
	return outbox.Record{
		KafkaTopic: topic,
		KafkaKey:   key,
		KafkaValue: value,
		KafkaHeaders: outbox.Headers{
			{Key: HeaderRun, Value: run},
			{Key: HeaderSeq, Value: strconv.FormatInt(seq, 10)},
			{Key: HeaderWritten, Value: strconv.FormatInt(time.Now().UnixNano(), 10)},
		},
	}
}

// Parse reads a stamp through header, which returns a message header's value by name.
func Parse(header func(name string) (string, bool)) (Stamp, error) {
	run, ok1 := header(HeaderRun)
	seq, ok2 := header(HeaderSeq)
	written, ok3 := header(HeaderWritten)
	if !ok1 || !ok2 || !ok3 {
		return Stamp{}, fmt.Errorf("message has no %s, %s and %s headers", HeaderRun, HeaderSeq, HeaderWritten)
	}
	s, err := strconv.ParseInt(seq, 10, 64)
	if err != nil {
		return Stamp{}, fmt.Errorf("header %s: %w", HeaderSeq, err)
	}
	w, err := strconv.ParseInt(written, 10, 64)
	if err != nil {
		return Stamp{}, fmt.Errorf("header %s: %w", HeaderWritten, err)
	}
	return Stamp{Run: run, Seq: s, Written: time.Unix(0, w)}, nil
}

// Reversal is a record that arrived after a later record of its key.
type Reversal struct {
	Key      string
	Seq      int64   // what arrived
	AfterSeq int64   // what had arrived just before, for the same key
	Recent   []int64 // the key's last few arrivals before it
}

func (r Reversal) String() string {
	return fmt.Sprintf("key %s: %d arrived after %d (recent: %v)", r.Key, r.Seq, r.AfterSeq, r.Recent)
}

// Checker accumulates what arrived. It is not safe for concurrent use.
type Checker struct {
	run       string
	keys      map[string]*keyState
	messages  int64
	reversals []Reversal
	latencies []time.Duration
	written   []int64 // each latency's record's write time, UnixNano
	first     time.Time
	last      time.Time
}

type keyState struct {
	seen   map[int64]bool
	recent []int64 // the last few sequence numbers, for reports
}

// NewChecker checks records of one run; other runs' records are ignored.
func NewChecker(run string) *Checker {
	return &Checker{run: run, keys: map[string]*keyState{}}
}

// Observe records one consumed message. It returns false for a message of another run.
func (c *Checker) Observe(key string, s Stamp, consumed time.Time) bool {
	if s.Run != c.run {
		return false
	}
	c.messages++
	if c.first.IsZero() || consumed.Before(c.first) {
		c.first = consumed
	}
	if consumed.After(c.last) {
		c.last = consumed
	}
	c.latencies = append(c.latencies, consumed.Sub(s.Written))
	c.written = append(c.written, s.Written.UnixNano())
	k := c.keys[key]
	if k == nil {
		k = &keyState{seen: map[int64]bool{}}
		c.keys[key] = k
	}
	if n := len(k.recent); n > 0 && s.Seq < k.recent[n-1] {
		c.reversals = append(c.reversals, Reversal{Key: key, Seq: s.Seq, AfterSeq: k.recent[n-1], Recent: slices.Clone(k.recent)})
	}
	k.seen[s.Seq] = true
	k.recent = append(k.recent, s.Seq)
	if len(k.recent) > 5 {
		k.recent = k.recent[1:]
	}
	return true
}

// Distinct returns how many different records have arrived.
func (c *Checker) Distinct() int64 {
	var n int64
	for _, k := range c.keys {
		n += int64(len(k.seen))
	}
	return n
}

// LatencyOfWritten returns the 99th percentile and the most of the write-to-consumption latency
// of the messages whose records were written from from to to, and how many messages those were:
// what a fault cost the records written while it lasted.
func (c *Checker) LatencyOfWritten(from, to time.Time) (p99, most time.Duration, n int) {
	var ls []time.Duration
	lo, hi := from.UnixNano(), to.UnixNano()
	for i, w := range c.written {
		if w >= lo && w <= hi {
			ls = append(ls, c.latencies[i])
		}
	}
	if len(ls) == 0 {
		return 0, 0, 0
	}
	slices.Sort(ls)
	return p99Of(ls), ls[len(ls)-1], len(ls)
}

// p99Of is the 99th percentile of sorted, which must not be empty.
func p99Of(sorted []time.Duration) time.Duration {
	return sorted[min(len(sorted)-1, len(sorted)*99/100)]
}

// Report summarises a check.
type Report struct {
	Expected   int64
	Messages   int64 // messages of this run consumed, repeats included
	Distinct   int64 // different records among them
	Duplicates int64 // Messages - Distinct
	Lost       []string
	LostCount  int64
	Missing    map[string][]int64 // the sequence numbers lost, by key
	Reversals  []Reversal
	P50, P99   time.Duration // write-to-consumption latency
	Max        time.Duration
	Span       time.Duration // from the first message consumed to the last
}

// OK reports whether nothing was lost and no key went backwards.
func (r Report) OK() bool { return r.LostCount == 0 && len(r.Reversals) == 0 }

// Report checks completeness against expected, the number of records written for each key
// (sequences 0 to n-1).
func (c *Checker) Report(expected map[string]int64) Report {
	r := Report{Messages: c.messages, Distinct: c.Distinct(), Reversals: c.reversals, Span: c.last.Sub(c.first)}
	r.Duplicates = r.Messages - r.Distinct
	keys := make([]string, 0, len(expected))
	for k := range expected {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		n := expected[key]
		r.Expected += n
		k := c.keys[key]
		var missing []int64
		for seq := range n {
			if k == nil || !k.seen[seq] {
				missing = append(missing, seq)
			}
		}
		if len(missing) > 0 {
			if r.Missing == nil {
				r.Missing = map[string][]int64{}
			}
			r.Missing[key] = missing
			r.LostCount += int64(len(missing))
			r.Lost = append(r.Lost, fmt.Sprintf("key %s: %s", key, ranges(missing)))
		}
	}
	if len(c.latencies) > 0 {
		sorted := slices.Clone(c.latencies)
		slices.Sort(sorted)
		r.P50 = sorted[len(sorted)/2]
		r.P99 = p99Of(sorted)
		r.Max = sorted[len(sorted)-1]
	}
	return r
}

// ranges writes sorted numbers compactly: "3, 7-9".
func ranges(ns []int64) string {
	var parts []string
	for i := 0; i < len(ns); {
		j := i
		for j+1 < len(ns) && ns[j+1] == ns[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, strconv.FormatInt(ns[i], 10))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ns[i], ns[j]))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

// String is the verdict, several lines long.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "records expected %d, arrived %d (%d messages, %d duplicates)\n", r.Expected, r.Distinct, r.Messages, r.Duplicates)
	if r.Span > 0 {
		fmt.Fprintf(&b, "consumed over %v: %.0f records/s\n", r.Span.Round(time.Millisecond), float64(r.Distinct)/r.Span.Seconds())
	}
	fmt.Fprintf(&b, "latency from write to consumption: p50 %v, p99 %v, max %v\n",
		r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.Max.Round(time.Microsecond))
	const show = 10
	fmt.Fprintf(&b, "lost: %d\n", r.LostCount)
	for _, l := range r.Lost[:min(show, len(r.Lost))] {
		fmt.Fprintf(&b, "  %s\n", l)
	}
	fmt.Fprintf(&b, "reversals: %d\n", len(r.Reversals))
	for _, rev := range r.Reversals[:min(show, len(r.Reversals))] {
		fmt.Fprintf(&b, "  %s\n", rev)
	}
	if r.OK() {
		b.WriteString("verdict: OK: nothing lost, per-key order held\n")
	} else {
		b.WriteString("verdict: FAILED\n")
	}
	return b.String()
}

// Backlog returns perKey stamped records for each of keys keys ("key-0", "key-1", ...),
// interleaved in sequence order as concurrent writers would produce them, and the count per key
// to check against.
func Backlog(topic, run string, keys, perKey int, value *string) ([]outbox.Record, map[string]int64) {
	records := make([]outbox.Record, 0, keys*perKey)
	expected := make(map[string]int64, keys)
	for seq := range perKey {
		for k := range keys {
			records = append(records, Record(topic, "key-"+strconv.Itoa(k), run, int64(seq), value))
		}
	}
	for k := range keys {
		expected["key-"+strconv.Itoa(k)] = int64(perKey)
	}
	return records, expected
}

// Message is one consumed message of a run: its key, its stamp and its id header's value.
type Message struct {
	Key   string
	Stamp Stamp
	ID    string
}

// Dedup is what a consumer that skips every message whose id header it has seen before
// (docs/messages.md's recipe) makes of the messages it consumed.
type Dedup struct {
	Removed int // repeats of a record under its id, skipped as they should be
	// Passed counts records processed twice under two ids: the same row published twice with
	// different ids, which the recipe cannot catch; never expected.
	Passed int
	// Rewritten counts records a writer wrote twice, as two rows (the same key and sequence
	// number, written at two times): a writer that retried a commit whose outcome it did not
	// know. They are the application's duplicates; the recipe rightly processes both.
	Rewritten int
	// Skipped counts records skipped because another record had carried their id: a new row
	// given the id of a published row that the promoted database had lost.
	Skipped int
}

// DedupByID applies the id recipe to messages in the order they were consumed. A row is told by
// its key, sequence number and write time, which a writer's retry changes.
func DedupByID(messages []Message) Dedup {
	type row struct {
		key     string
		seq     int64
		written int64
	}
	type record struct {
		key string
		seq int64
	}
	var d Dedup
	byID := map[string]row{}
	processedRows := map[row]bool{}
	processed := map[record]bool{}
	for _, m := range messages {
		r := row{m.Key, m.Stamp.Seq, m.Stamp.Written.UnixNano()}
		if first, seen := byID[m.ID]; seen {
			if first == r {
				d.Removed++
			} else {
				d.Skipped++
			}
			continue
		}
		byID[m.ID] = r
		switch {
		case processedRows[r]:
			d.Passed++
		case processed[record{r.key, r.seq}]:
			d.Rewritten++
		}
		processedRows[r] = true
		processed[record{r.key, r.seq}] = true
	}
	return d
}
