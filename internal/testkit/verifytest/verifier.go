// Package verifytest consumes a topic in tests and checks the stamped records that arrive (see
// package verify).
package verifytest

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/internal/testkit/verify"
)

// Verifier consumes a topic from the start and checks the stamped records of one run (see
// package verify).
type Verifier struct {
	mu       sync.Mutex
	checker  *verify.Checker
	arrivals []time.Time      // when each batch of records arrived, in order
	idHeader string           // the header whose value messages records, "" for none
	messages []verify.Message // every message of the run, in order, when idHeader is set
	cancel   context.CancelFunc
	done     chan struct{}
}

// Start starts consuming topic at addr, reading committed records only, as every consumer of a
// transactional producer should; it stops when the test ends.
func Start(tb testing.TB, addr, topic, run string) *Verifier {
	tb.Helper()
	return start(tb, addr, topic, run, kgo.ReadCommitted())
}

// StartUncommitted is Start for a consumer that also reads the records of aborted transactions
// (the Java client's default), to check what such a consumer sees.
func StartUncommitted(tb testing.TB, addr, topic, run string) *Verifier {
	tb.Helper()
	return start(tb, addr, topic, run, kgo.ReadUncommitted())
}

// StartUncommittedWithIDs is StartUncommitted that also keeps every message of the run with the
// value of its idHeader header, for Messages.
func StartUncommittedWithIDs(tb testing.TB, addr, topic, run, idHeader string) *Verifier {
	tb.Helper()
	return startWith(tb, addr, topic, run, kgo.ReadUncommitted(), idHeader)
}

func start(tb testing.TB, addr, topic, run string, isolation kgo.IsolationLevel) *Verifier {
	tb.Helper()
	return startWith(tb, addr, topic, run, isolation, "")
}

func startWith(tb testing.TB, addr, topic, run string, isolation kgo.IsolationLevel, idHeader string) *Verifier {
	tb.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(addr, ",")...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(isolation))
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	v := &Verifier{checker: verify.NewChecker(run), cancel: cancel, done: make(chan struct{}), idHeader: idHeader}
	go func() {
		defer close(v.done)
		defer cl.Close()
		for ctx.Err() == nil {
			fetches := cl.PollFetches(ctx)
			now := time.Now()
			v.mu.Lock()
			if fetches.NumRecords() > 0 {
				v.arrivals = append(v.arrivals, now)
			}
			fetches.EachRecord(func(rec *kgo.Record) {
				stamp, err := ParseRecord(rec)
				if err != nil {
					tb.Errorf("offset %d: %v", rec.Offset, err)
					return
				}
				if v.checker.Observe(string(rec.Key), stamp, now) && idHeader != "" {
					id, _ := header(rec, idHeader)
					v.messages = append(v.messages, verify.Message{Key: string(rec.Key), Stamp: stamp, ID: id})
				}
			})
			v.mu.Unlock()
		}
	}()
	tb.Cleanup(v.Stop)
	return v
}

// ParseRecord reads the stamp of a consumed record.
func ParseRecord(rec *kgo.Record) (verify.Stamp, error) {
	return verify.Parse(func(name string) (string, bool) { return header(rec, name) })
}

// header returns the value of a record's first header of that name, and whether it has one.
func header(rec *kgo.Record, name string) (string, bool) {
	for _, h := range rec.Headers {
		if h.Key == name {
			return string(h.Value), true
		}
	}
	return "", false
}

// Messages returns the run's messages consumed so far, with their id headers (see
// StartUncommittedWithIDs), in the order they arrived.
func (v *Verifier) Messages() []verify.Message {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.messages)
}

// Stop stops consuming; calling it again does nothing.
func (v *Verifier) Stop() {
	v.cancel()
	<-v.done
}

// WaitDistinct waits until n different records have arrived, failing the test after within.
func (v *Verifier) WaitDistinct(tb testing.TB, n int64, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for {
		v.mu.Lock()
		got := v.checker.Distinct()
		v.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d records arrived within %v", got, n, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FirstArrivalAfter returns when the first records arrived after t, or the zero time.
func (v *Verifier) FirstArrivalAfter(t time.Time) time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, a := range v.arrivals {
		if a.After(t) {
			return a
		}
	}
	return time.Time{}
}

// Distinct returns how many different records have arrived so far.
func (v *Verifier) Distinct() int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.checker.Distinct()
}

// LatencyOfWritten is verify.Checker's, of what arrived so far.
func (v *Verifier) LatencyOfWritten(from, to time.Time) (p99, most time.Duration, n int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.checker.LatencyOfWritten(from, to)
}

// Report checks what arrived against expected (records written per key).
func (v *Verifier) Report(expected map[string]int64) verify.Report {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.checker.Report(expected)
}
