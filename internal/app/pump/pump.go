// Package pump is the load generator and end-to-end checker behind cmd/pump. It writes stamped
// records (see package verify) to an outbox through the stasher, from several connections in
// multi-record transactions, and can consume the target topic to check that every record arrived
// in per-key order, and how fast.
package pump

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/rdlog"
	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// Exit codes.
const (
	ExitOK     = 0
	ExitFailed = 1 // a loss or a reversal, or a runtime error
	ExitUsage  = 2
)

// Options configure a pump run.
type Options struct {
	DataSource string
	Outbox     string
	Topic      string
	Keys       int
	Records    int           // total to write; 0 means write for Duration
	Duration   time.Duration // used when Records is 0
	Writers    int
	Batch      int           // records per transaction
	Interval   time.Duration // pause between one writer's transactions
	ValueSize  int
	Run        string

	Verify  bool // consume the topic and check the run
	Brokers string
	Timeout time.Duration // how long verification waits for the last record
}

const usage = `usage:
  pump [flags]          write records to the outbox (with -verify, also check they arrive)
  pump verify [flags]   check a run that wrote -records over -keys

flags:
`

func (o *Options) flags(fs *flag.FlagSet) {
	fs.StringVar(&o.DataSource, "dsn", postgres.DefaultDataSource, "Postgres data source")
	fs.StringVar(&o.Outbox, "outbox", outbox.DefaultTable, "outbox table")
	fs.StringVar(&o.Topic, "topic", "pump", "Kafka topic the records name")
	fs.IntVar(&o.Keys, "keys", 100, "number of distinct keys")
	fs.IntVar(&o.Records, "records", 10_000, "records to write (0: write for -duration)")
	fs.DurationVar(&o.Duration, "duration", 0, "write for this long, when -records is 0")
	fs.IntVar(&o.Writers, "writers", 4, "connections writing at once")
	fs.IntVar(&o.Batch, "batch", 10, "records per transaction")
	fs.DurationVar(&o.Interval, "interval", 0, "pause between one writer's transactions")
	fs.IntVar(&o.ValueSize, "value-size", 256, "bytes per record value")
	fs.StringVar(&o.Run, "run", "", "run ID stamped on every record (default: random)")
	fs.BoolVar(&o.Verify, "verify", false, "consume the topic and check that every record arrives in per-key order")
	fs.StringVar(&o.Brokers, "brokers", reaper.DefaultBootstrapServers, "Kafka bootstrap servers, for verification")
	fs.DurationVar(&o.Timeout, "timeout", 2*time.Minute, "how long verification waits for the last record")
}

func (o *Options) validate(verifyOnly bool) error {
	var errs []error
	if o.Keys < 1 {
		errs = append(errs, fmt.Errorf("-keys %d: must be at least 1", o.Keys))
	}
	if o.Records < 0 || (o.Records == 0 && (verifyOnly || o.Duration <= 0)) {
		errs = append(errs, fmt.Errorf("-records %d: must be positive (or 0 with a positive -duration when writing)", o.Records))
	}
	if o.Writers < 1 || o.Batch < 1 || o.ValueSize < 0 {
		errs = append(errs, fmt.Errorf("-writers, -batch must be at least 1 and -value-size at least 0"))
	}
	if verifyOnly && o.Run == "" {
		errs = append(errs, errors.New("-run: required by pump verify"))
	}
	return errors.Join(errs...)
}

// Main runs the pump with args (without the program name) and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	verifyOnly := len(args) > 0 && args[0] == "verify"
	if verifyOnly {
		args = args[1:]
	}
	var o Options
	fs := flag.NewFlagSet("pump", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	o.flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return ExitOK
		}
		return ExitUsage
	}
	if err := o.validate(verifyOnly); err != nil {
		fmt.Fprintln(stderr, "pump:", strings.ReplaceAll(err.Error(), "\n", "; "))
		return ExitUsage
	}
	if o.Run == "" {
		o.Run = uuid.NewString()
	}
	var err error
	var report verify.Report
	if verifyOnly {
		report, err = VerifyOnly(ctx, o, stdout)
	} else {
		report, err = Pump(ctx, o, stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "pump:", err)
		return ExitFailed
	}
	if (o.Verify || verifyOnly) && !report.OK() {
		return ExitFailed
	}
	return ExitOK
}

// Expected returns how many of total records each key gets: record i goes to key i mod keys.
func Expected(total, keys int) map[string]int64 {
	out := make(map[string]int64, keys)
	for k := range keys {
		n := total / keys
		if k < total%keys {
			n++
		}
		out[keyName(k)] = int64(n)
	}
	return out
}

func keyName(k int) string { return "key-" + strconv.Itoa(k) }

// Pump writes the load and, with Verify, checks it; it prints progress once a second and the
// verdict at the end.
func Pump(ctx context.Context, o Options, out io.Writer) (verify.Report, error) {
	pool, err := pgxpool.New(ctx, o.DataSource)
	if err != nil {
		return verify.Report{}, fmt.Errorf("connect: %w", err)
	}
	defer pool.Close()
	st, err := stasher.New(o.Outbox)
	if err != nil {
		return verify.Report{}, err
	}

	var consumer *checkingConsumer
	if o.Verify {
		if consumer, err = startConsumer(o); err != nil {
			return verify.Report{}, err
		}
		defer consumer.close()
	}

	w := &writers{o: o, pool: pool, st: st, value: strings.Repeat("x", o.ValueSize), written: map[string]int64{}}
	fmt.Fprintf(out, "pump: run %s: writing %s over %d keys to %s (topic %s), %d writers, %d records per transaction\n",
		o.Run, w.amount(), o.Keys, o.Outbox, o.Topic, o.Writers, o.Batch)
	stopProgress := progress(out, &w.total, consumer)
	err = w.run(ctx)
	stopProgress()
	if err != nil {
		return verify.Report{}, err
	}
	fmt.Fprintf(out, "pump: wrote %d records in %v (%.0f records/s)\n", w.total.Load(), w.elapsed.Round(time.Millisecond),
		float64(w.total.Load())/w.elapsed.Seconds())
	if consumer == nil {
		return verify.Report{}, nil
	}
	return consumer.await(ctx, w.expected(), o.Timeout, out)
}

// VerifyOnly checks a run written earlier with o.Records over o.Keys.
func VerifyOnly(ctx context.Context, o Options, out io.Writer) (verify.Report, error) {
	consumer, err := startConsumer(o)
	if err != nil {
		return verify.Report{}, err
	}
	defer consumer.close()
	return consumer.await(ctx, Expected(o.Records, o.Keys), o.Timeout, out)
}

// writers write the load; key k belongs to writer k mod Writers, so that each key's records are
// committed in sequence order.
type writers struct {
	o     Options
	pool  *pgxpool.Pool
	st    *stasher.Stasher
	value string

	total   atomic.Int64
	elapsed time.Duration

	mu      sync.Mutex
	written map[string]int64
}

func (w *writers) amount() string {
	if w.o.Records > 0 {
		return fmt.Sprintf("%d records", w.o.Records)
	}
	return "for " + w.o.Duration.String()
}

func (w *writers) expected() map[string]int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.written
}

func (w *writers) run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	quota := Expected(w.o.Records, w.o.Keys)
	start := time.Now()
	// A timed run stops between transactions: cancelling one mid-commit could leave it committed
	// but uncounted.
	var deadline time.Time
	if w.o.Records == 0 {
		deadline = start.Add(w.o.Duration)
	}
	errs := make(chan error, w.o.Writers)
	var wg sync.WaitGroup
	for i := range min(w.o.Writers, w.o.Keys) {
		var keys []string
		for k := i; k < w.o.Keys; k += w.o.Writers {
			keys = append(keys, keyName(k))
		}
		wg.Go(func() {
			if err := w.write(ctx, keys, quota, deadline); err != nil {
				errs <- err
				cancel()
			}
		})
	}
	wg.Wait()
	w.elapsed = time.Since(start)
	close(errs)
	return <-errs
}

// write commits batches of records for keys, round-robin, until each key has its quota (or, for
// a timed run, until deadline).
func (w *writers) write(ctx context.Context, keys []string, quota map[string]int64, deadline time.Time) error {
	next := map[string]int64{}
	timed := !deadline.IsZero()
	for i := 0; ; {
		if timed && !time.Now().Before(deadline) {
			return nil
		}
		var batch []outbox.Record
		for tries := 0; len(batch) < w.o.Batch && tries < len(keys); {
			key := keys[i%len(keys)]
			i++
			if !timed && next[key] >= quota[key] {
				tries++
				continue
			}
			tries = 0
			batch = append(batch, verify.Record(w.o.Topic, key, w.o.Run, next[key], &w.value))
			next[key]++
		}
		if len(batch) == 0 {
			return nil
		}
		err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error { return w.st.StashPgx(ctx, tx, batch...) })
		if err != nil {
			return fmt.Errorf("write: %w", err)
		}
		w.total.Add(int64(len(batch)))
		w.mu.Lock()
		for _, rec := range batch {
			w.written[rec.KafkaKey]++
		}
		w.mu.Unlock()
		if w.o.Interval > 0 {
			select {
			case <-time.After(w.o.Interval):
			case <-ctx.Done():
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// progress prints a line a second: records written (and consumed), now and on average.
func progress(out io.Writer, total *atomic.Int64, consumer *checkingConsumer) (stop func()) {
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		start, last, lastConsumed, lastAt := time.Now(), int64(0), int64(0), time.Now()
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				n, interval := total.Load(), now.Sub(lastAt).Seconds()
				line := fmt.Sprintf("pump: written %d records, %.0f/s now, %.0f/s average",
					n, float64(n-last)/interval, float64(n)/now.Sub(start).Seconds())
				if consumer != nil {
					consumed := consumer.distinct()
					line += fmt.Sprintf("; consumed %d, %.0f/s now", consumed, float64(consumed-lastConsumed)/interval)
					lastConsumed = consumed
				}
				fmt.Fprintln(out, line)
				last, lastAt = n, now
			}
		}
	}()
	return func() { close(done); <-finished }
}

// checkingConsumer reads the topic from the start and feeds the checker.
type checkingConsumer struct {
	c       *kafka.Consumer
	mu      sync.Mutex
	checker *verify.Checker
	bad     int // messages without a readable stamp
	stop    chan struct{}
	done    chan struct{}
}

func startConsumer(o Options) (*checkingConsumer, error) {
	cm := kafka.ConfigMap{
		"bootstrap.servers":  o.Brokers,
		"group.id":           "pump-verify-" + o.Run + "-" + uuid.NewString(),
		"auto.offset.reset":  "earliest",
		"enable.auto.commit": false,
	}
	// librdkafka would print its routine lines (%6|...|GETSUBSCRIPTIONS|...) on standard error,
	// among the pump's own; only its warnings and errors are worth a reader's attention, and they
	// go where librdkafka wrote them, standard error.
	rdlog.Enable(cm)
	c, err := kafka.NewConsumer(&cm)
	if err != nil {
		return nil, fmt.Errorf("consumer: %w", err)
	}
	rdlog.Forward(c.Logs(), slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err := c.Subscribe(o.Topic, nil); err != nil {
		c.Close()
		return nil, fmt.Errorf("subscribe to %s: %w", o.Topic, err)
	}
	cc := &checkingConsumer{c: c, checker: verify.NewChecker(o.Run), stop: make(chan struct{}), done: make(chan struct{})}
	go cc.consume()
	return cc, nil
}

func (cc *checkingConsumer) consume() {
	defer close(cc.done)
	for {
		select {
		case <-cc.stop:
			return
		default:
		}
		msg, ok := cc.c.Poll(100).(*kafka.Message)
		if !ok || msg.TopicPartition.Error != nil {
			continue
		}
		stamp, err := verify.Parse(func(name string) (string, bool) {
			for _, h := range msg.Headers {
				if h.Key == name {
					return string(h.Value), true
				}
			}
			return "", false
		})
		cc.mu.Lock()
		if err != nil {
			cc.bad++
		} else {
			cc.checker.Observe(string(msg.Key), stamp, time.Now())
		}
		cc.mu.Unlock()
	}
}

func (cc *checkingConsumer) distinct() int64 {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	return cc.checker.Distinct()
}

// await waits until every expected record has arrived (or timeout), then prints and returns the
// report.
func (cc *checkingConsumer) await(ctx context.Context, expected map[string]int64, timeout time.Duration, out io.Writer) (verify.Report, error) {
	var want int64
	for _, n := range expected {
		want += n
	}
	deadline := time.Now().Add(timeout)
	for cc.distinct() < want && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	// Let stragglers (duplicates, or reversals) arrive before judging.
	time.Sleep(500 * time.Millisecond)
	cc.mu.Lock()
	report := cc.checker.Report(expected)
	bad := cc.bad
	cc.mu.Unlock()
	fmt.Fprint(out, indent(report.String()))
	if bad > 0 {
		fmt.Fprintf(out, "pump: %d messages on the topic carried no stamp and were ignored\n", bad)
	}
	return report, nil
}

func (cc *checkingConsumer) close() {
	close(cc.stop)
	<-cc.done
	cc.c.Close()
}

func indent(s string) string {
	return "pump: " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\npump: ") + "\n"
}
