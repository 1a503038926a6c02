// Package int holds the fault-tolerance suite: real reaper processes, a real Postgres (or
// MariaDB, for the scenarios with a MySQL outbox) and a 3-node Apache Kafka cluster (kfake where
// a scenario needs a fault only it can inject),
// continuous writers, and faults injected while they run. Every scenario
// ends by checking that each record was published at least once, that no key went backwards and
// that the outbox is empty. The short variants run in make test; make chaos runs the long ones
// (GOHARVEST_CHAOS=1) and prints the figures README reports.
package int

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/buildtest"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
	"github.com/goharvest/goharvest/internal/testkit/leakcheck"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/internal/testkit/verifytest"
)

// The scenarios share one 3-node cluster, as production runs: every topic replicated three ways
// with min.insync.replicas 2. Topics are not created on demand, as production clusters often
// have it: each scenario creates its own. A scenario that faults brokers restores them when it
// ends (rigOptions.kafka).
func TestMain(m *testing.M) {
	kafkacluster.SetShared(append(clusterOptions, kafkacluster.Proxied())...)
	os.Exit(leakcheck.After(pgtest.Run(mariadbtest.Around(kafkacluster.Around(m)))))
}

// clusterOptions are those of every cluster the scenarios run on: 3 nodes, no topic created on
// demand.
var clusterOptions = []kafkacluster.Option{kafkacluster.Nodes(3),
	kafkacluster.BrokerConfig(map[string]string{"auto.create.topics.enable": "false"})}

// long reports whether the long variants run (make chaos).
func long() bool { return os.Getenv("GOHARVEST_CHAOS") != "" }

// pick returns short in make test and chaos under make chaos.
func pick[T any](short, chaos T) T {
	if long() {
		return chaos
	}
	return short
}

// rig is one outbox, one Kafka cluster, and the reapers and writers around them.
type rig struct {
	t      *testing.T
	run    string
	dsn    string
	db     outboxDB      // the outbox's database
	pool   *pgxpool.Pool // the outbox's Postgres, for scenarios that reach into it; nil on MySQL
	topic  string
	group  string                        // the reapers' leader group
	addr   string                        // Kafka's bootstrap servers
	kafka  *kafkacluster.Cluster         // nil on kfake
	fake   *kafkatest.Broker             // set on kfake only
	config string                        // reaper.yaml
	yaml   func(bootstrap string) string // reaper.yaml's text, for Kafka at bootstrap
	shards int
	bin    string
	v      *verifytest.Verifier
	w      *writers

	preloaded map[string]int64 // records per key written by preload
	all       []*reaper        // every reaper started, in order
}

// kafkaChoice is which Kafka a scenario runs on.
type kafkaChoice int

const (
	sharedKafka  kafkaChoice = iota // the package's 3-node cluster
	faultedKafka                    // the package's cluster, whose brokers the scenario faults; restored when it ends
	defaultKafka                    // a 3-node cluster of the scenario's own with Kafka's default group timings
	kfakeOnly                       // kfake, for a fault only it can inject; the scenario says which
)

var rigs atomic.Int64

type rigOptions struct {
	kafka            kafkaChoice
	heartbeatTimeout time.Duration
	extraYAML        string // more lines under harvest.limits
	// readCommitted makes the verifier read committed records only. Otherwise it also reads those
	// of aborted transactions, the stricter check that one record per key in flight passes.
	readCommitted bool
	// slowPurge makes every DELETE on the outbox take 50ms longer, so that a leader is more
	// often killed between a commit and its purge.
	slowPurge bool
	// shards splits the outbox into this many shards (harvest.shards), with the index a sharded
	// outbox needs. Default 1.
	shards int
	// mysql puts the outbox in MySQL (the reapers' database: mysql) rather than Postgres.
	mysql bool
	// dsn is the outbox's database, whose table the caller created; by default a new database
	// on the shared server (Postgres's, or MariaDB's with mysql).
	dsn string
	// idHeader sets harvest.idHeader, and the verifier keeps every message's id (Messages).
	idHeader string
	// defaultLimits leaves minPollInterval and ioErrorBackoff at goharvest's defaults, which the
	// other scenarios shorten to speed up recovery.
	defaultLimits bool
	// brokerConfig is more broker settings for a defaultKafka cluster (the production scenarios'
	// GOHARVEST_PRODUCTION_BROKER).
	brokerConfig map[string]string
}

func newRig(t *testing.T, o rigOptions) *rig {
	t.Helper()
	if o.heartbeatTimeout == 0 {
		o.heartbeatTimeout = time.Second
	}
	if o.shards == 0 {
		o.shards = 1
	}
	ctx := context.Background()
	r := &rig{t: t, shards: o.shards, run: t.Name() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36), bin: reaperBinary(t)}
	if o.mysql {
		r.db = newMySQLDB(t, o.dsn)
	} else {
		pg := newPostgresDB(t, o.dsn)
		r.db, r.pool = pg, pg.pool
	}
	r.dsn = r.db.dataSource()
	id := fmt.Sprintf("scenario%d", rigs.Add(1))
	r.topic, r.group = id+".events", id
	switch o.kafka {
	case sharedKafka, faultedKafka, defaultKafka:
		r.kafka = kafkacluster.Shared(t)
		switch o.kafka {
		case faultedKafka:
			// Faulting the shared cluster rather than starting one costs no three more JVMs on
			// a 2-core machine, which left a cold cluster too slow for 1s heartbeats. Whatever
			// the scenario left stopped or frozen runs again before the next scenario.
			t.Cleanup(func() { restore(t, r.kafka) })
		case defaultKafka:
			// brokerConfig: what an operator tuned, for the production scenarios to measure.
			r.kafka = kafkacluster.Start(t, append(clusterOptions, kafkacluster.GroupDefaults(), kafkacluster.BrokerConfig(o.brokerConfig))...)
		}
		r.addr = r.kafka.Addr()
		r.kafka.Topic(t, r.topic, 8)
	case kfakeOnly:
		r.fake = kafkatest.Start(t, kafkatest.WithTopics(8, r.topic), kafkatest.WithoutAutoTopicCreation())
		r.addr = r.fake.Addr()
	}
	r.config = filepath.Join(t.TempDir(), "reaper.yaml")
	limits := "    minPollInterval: 50ms\n    ioErrorBackoff: 100ms\n"
	if o.defaultLimits {
		limits = ""
	}
	r.yaml = func(bootstrap string) string {
		return fmt.Sprintf(`harvest:
  baseKafkaConfig:
    bootstrap.servers: %s
  leaderTopic: %s.leader
  leaderGroupID: %s
%s  dataSource: ${DATABASE_URL}
  shards: %d
  idHeader: "%s"
%s  limits:
    heartbeatTimeout: %s
%s%s
logging:
  level: info
  format: json
`, bootstrap, id, id, r.db.yaml(), o.shards, o.idHeader, claimStrategyYAML()+kafkaClientYAML(), o.heartbeatTimeout, limits, o.extraYAML)
	}
	if err := os.WriteFile(r.config, []byte(r.yaml(r.addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	if pg, ok := r.db.(*postgresDB); ok && o.shards > 1 {
		if err := pg.shardIndex(ctx, o.shards); err != nil {
			t.Fatal(err)
		}
	}
	if o.slowPurge {
		_, err := r.pool.Exec(ctx, `CREATE FUNCTION slow_purge() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN PERFORM pg_sleep(0.05); RETURN NULL; END $$;
			CREATE TRIGGER slow_purge BEFORE DELETE ON outbox FOR EACH STATEMENT EXECUTE FUNCTION slow_purge()`)
		if err != nil {
			t.Fatal(err)
		}
	}
	switch {
	case o.idHeader != "":
		r.v = verifytest.StartUncommittedWithIDs(t, r.addr, r.topic, r.run, o.idHeader)
	case o.readCommitted:
		r.v = verifytest.Start(t, r.addr, r.topic, r.run)
	default:
		r.v = verifytest.StartUncommitted(t, r.addr, r.topic, r.run)
	}
	return r
}

// restore thaws every frozen node of c, starts every stopped one, and waits until c serves.
func restore(t *testing.T, c *kafkacluster.Cluster) {
	for _, n := range c.Nodes() {
		n.Thaw()
		if !n.Running() {
			if err := n.Start(); err != nil {
				t.Errorf("restore node %d: %v", n.ID, err)
			}
		}
	}
	if err := c.WaitReady(2 * time.Minute); err != nil {
		t.Errorf("restore the cluster: %v", err)
	}
}

// rows counts what is left in the outbox.
func (r *rig) rows() int {
	n, err := r.db.rows(context.Background())
	if err != nil {
		return -1 // the database may be down in the middle of a fault
	}
	return n
}

// finish stops the writers, waits until everything written has been published and purged,
// and checks the deliveries. It returns the verifier's report.
func (r *rig) finish(within time.Duration) verify.Report {
	r.t.Helper()
	expected := r.w.stop()
	var total int64
	for _, n := range expected {
		total += n
	}
	r.v.WaitDistinct(r.t, total, within)
	if !testwait.Until(within, func() bool { return r.rows() == 0 }) {
		r.t.Fatalf("%d rows still in the outbox after %v", r.rows(), within)
	}
	// Let stragglers (repeats, reversals) arrive: nothing announces the last of them.
	time.Sleep(500 * time.Millisecond)
	report := r.v.Report(expected)
	if !report.OK() {
		r.t.Errorf("delivery check failed:\n%s", report)
	}
	r.t.Logf("records %d, duplicates %d, latency p50 %v p99 %v max %v", report.Expected, report.Duplicates,
		report.P50.Round(time.Millisecond), report.P99.Round(time.Millisecond), report.Max.Round(time.Millisecond))
	return report
}

// preload writes a backlog of stamped records over keys before any reaper runs.
func (r *rig) preload(records, keys int) {
	r.t.Helper()
	r.preloaded = preloadDB(r.t, r.db, r.topic, r.run, keys, records/keys, goharvest.String(strings.Repeat("v", 256)))
}

// writers insert stamped records continuously, each key owned by one writer so its commit
// order is defined. Each transaction waits a random few milliseconds before committing, so that
// transactions commit out of id order.
type writers struct {
	cancel context.CancelFunc
	done   sync.WaitGroup
	mu     sync.Mutex
	count  map[string]int64
}

func (r *rig) startWriters(n, keys int, perSecond int) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &writers{cancel: cancel, count: map[string]int64{}}
	r.w = w
	value := "payload"
	pause := time.Duration(0)
	if perSecond > 0 {
		pause = time.Duration(int64(time.Second) * int64(n) * 5 / int64(perSecond))
	}
	for i := range n {
		var owned []string
		for k := i; k < keys; k += n {
			owned = append(owned, "key-"+strconv.Itoa(k))
		}
		w.done.Go(func() {
			next := map[string]int64{}
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			for j := 0; ctx.Err() == nil; {
				batch := make([]goharvest.OutboxRecord, 0, 5)
				for range 5 {
					key := owned[j%len(owned)]
					j++
					batch = append(batch, verify.Record(r.topic, key, r.run, next[key], &value))
					next[key]++
				}
				err := r.db.stash(ctx, batch, func() {
					time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond) // commit out of id order
				})
				if err != nil {
					// Not committed (the database may be down): write the same records again.
					for _, rec := range batch {
						next[rec.KafkaKey]--
					}
					j -= len(batch)
					time.Sleep(50 * time.Millisecond) // a writer's backoff after a failed insert
					continue
				}
				w.mu.Lock()
				for _, rec := range batch {
					w.count[rec.KafkaKey]++
				}
				w.mu.Unlock()
				if pause > 0 {
					time.Sleep(pause) // paces the load at the rate asked
				}
			}
		})
	}
}

// stop ends the writers and returns how many records each key got.
func (w *writers) stop() map[string]int64 {
	w.cancel()
	w.done.Wait()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.count
}

func reaperBinary(t *testing.T) string {
	return buildtest.Binary(t, "github.com/goharvest/goharvest/cmd/reaper")
}

// reaper is one reaper process, whose JSON log tells whether it leads.
type reaper struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
	// admin is the address of its status page, /readyz among it, from its log.
	admin atomic.Pointer[string]

	mu sync.Mutex
	// led holds the shards the log says this reaper publishes now, each with when it acquired it.
	// A frozen or killed reaper cannot say it lost them: callers know which reapers are alive.
	led map[int]time.Time
	// granted holds the shards the election says it holds now. A shard can be in led and
	// not here only if the harvester failed to log losing it: unlogged records when that was seen.
	granted  map[int]bool
	unlogged []unloggedLoss
	pending  map[int]time.Time // shards the election took whose loss the harvester has yet to log
	// history is every acquisition and loss of a shard, in log order; assigned is when the
	// election gave it each shard (before the shard's epoch starts).
	history, assigned []shardEvent
	acquired          []time.Time
	events            []string
	// notedPurges counts epochs that began by purging records a predecessor's note listed.
	notedPurges int
	// elected is when the election last made this reaper leader (before its epoch starts);
	// remarks counts epochs ended by an error, fences epochs ended by losing leadership.
	elected         time.Time
	remarks, fences int
	// fencedAt is when it last said it fenced itself (no heartbeat back in time); selfFenced is
	// every time it said so.
	fencedAt   time.Time
	selfFenced []time.Time
	// outboxLed holds, for a reaper of several outboxes (whose log lines name their outbox), the
	// shards it publishes now of each outbox; see leads.
	outboxLed map[string]map[int]bool
}

// counts returns the reaper's remarks and fences so far.
func (p *reaper) counts() (remarks, fences int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.remarks, p.fences
}

func (r *rig) startReaper(name string) *reaper {
	r.t.Helper()
	return r.startReaperWith(name, r.config)
}

// startReaperThrough starts a reaper that reaches Kafka through the cluster's proxies (see
// kafkacluster.Proxied), so that Partition cuts it off, and it alone.
func (r *rig) startReaperThrough(name string) *reaper {
	r.t.Helper()
	config := filepath.Join(r.t.TempDir(), "reaper-proxied.yaml")
	if err := os.WriteFile(config, []byte(r.yaml(r.kafka.ProxiedAddr())), 0o600); err != nil {
		r.t.Fatal(err)
	}
	return r.startReaperWith(name, config)
}

func (r *rig) startReaperWith(name, config string) *reaper {
	r.t.Helper()
	p := &reaper{name: name, done: make(chan struct{}), led: map[int]time.Time{}, granted: map[int]bool{}, pending: map[int]time.Time{}}
	r.all = append(r.all, p)
	p.cmd = exec.Command(r.bin, "-f", config)
	p.cmd.Env = append(os.Environ(), "DATABASE_URL="+r.dsn)
	// GOHARVEST_INT_LOGS keeps every reaper's log in a directory of one's choosing, to read after
	// a run; otherwise the logs go with the test.
	dir := os.Getenv("GOHARVEST_INT_LOGS")
	if dir == "" {
		dir = r.t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		r.t.Fatal(err)
	}
	logPath := filepath.Join(dir, strings.ReplaceAll(r.t.Name(), "/", "_")+"-"+name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		r.t.Fatal(err)
	}
	p.log = f
	out, err := p.cmd.StderrPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	scanned := make(chan struct{})
	go func() { defer close(scanned); p.scan(io.TeeReader(out, f)) }()
	go func() { <-scanned; p.cmd.Wait(); close(p.done) }()
	r.t.Cleanup(func() {
		p.cmd.Process.Signal(syscall.SIGCONT)
		p.cmd.Process.Kill()
		<-p.done
		f.Close()
		if r.t.Failed() {
			// The log goes with the test's directory; show its end while it is still there.
			data, _ := os.ReadFile(logPath)
			lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
			r.t.Logf("last lines of %s's log:\n%s", name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
		}
	})
	return p
}

// shardEvent is a shard's leadership gained or lost by one reaper, timed by the reaper's log.
type shardEvent struct {
	shard    int
	at       time.Time
	acquired bool
}

func (p *reaper) scan(out io.Reader) {
	s := bufio.NewScanner(out)
	s.Buffer(make([]byte, 64*1024), 1024*1024)
	for s.Scan() {
		var line struct {
			Msg        string    `json:"msg"`
			Time       time.Time `json:"time"`
			Shard      *int      `json:"shard"`
			Partitions string    `json:"partitions"`
			Outbox     string    `json:"outbox"`
			Address    string    `json:"address"`
		}
		if json.Unmarshal(s.Bytes(), &line) != nil {
			continue
		}
		if strings.HasPrefix(line.Msg, "serving the status page") {
			p.admin.Store(&line.Address)
		}
		p.mu.Lock()
		p.scanOutbox(line.Msg, line.Outbox, line.Shard)
		switch line.Msg {
		case "leader acquired":
			p.acquired = append(p.acquired, time.Now())
			p.events = append(p.events, line.Msg)
			if line.Shard != nil {
				p.notLogged(*line.Shard)
				p.led[*line.Shard] = line.Time
				p.history = append(p.history, shardEvent{shard: *line.Shard, at: line.Time, acquired: true})
			}
		case "leader revoked", "leader fenced", "stopping":
			p.events = append(p.events, line.Msg)
			if line.Shard != nil {
				delete(p.led, *line.Shard)
				delete(p.pending, *line.Shard)
				p.history = append(p.history, shardEvent{shard: *line.Shard, at: line.Time})
			} else {
				p.loseAll(line.Time)
			}
		case "purged records an earlier leader published and had not purged":
			p.notedPurges++
		case "acquired leadership":
			p.elected = time.Now()
			for part := range strings.SplitSeq(line.Partitions, ",") {
				if shard, err := strconv.Atoi(part); err == nil {
					p.notLogged(shard)
					p.granted[shard] = true
					p.assigned = append(p.assigned, shardEvent{shard: shard, at: line.Time, acquired: true})
				}
			}
		case "leadership revoked":
			// On a revoke the harvester logs its loss just after this line (the election's barrier); on
			// a fence, just before.
			for part := range strings.SplitSeq(line.Partitions, ",") {
				if shard, err := strconv.Atoi(part); err == nil {
					delete(p.granted, shard)
					if _, ok := p.led[shard]; ok {
						p.pending[shard] = line.Time
					}
				}
			}
		case "remark requested":
			p.remarks++
		case "no heartbeat acknowledged within the timeout; stepping down and rejoining the group":
			p.fencedAt = line.Time
			p.selfFenced = append(p.selfFenced, line.Time)
		}
		if line.Msg == "leader fenced" || line.Msg == "leader revoked" {
			p.fences++
		}
		p.mu.Unlock()
	}
	p.mu.Lock()
	p.loseAll(time.Now())
	clear(p.outboxLed)
	p.mu.Unlock()
}

// scanOutbox follows, from a log line of a reaper of several outboxes, which shards of each
// outbox it publishes; the caller holds p.mu.
func (p *reaper) scanOutbox(msg, outbox string, shard *int) {
	if p.outboxLed == nil {
		p.outboxLed = map[string]map[int]bool{}
	}
	switch {
	case outbox == "" && msg == "stopping":
		clear(p.outboxLed)
	case outbox == "":
	case msg == "leader acquired" && shard != nil:
		if p.outboxLed[outbox] == nil {
			p.outboxLed[outbox] = map[int]bool{}
		}
		p.outboxLed[outbox][*shard] = true
	case msg == "leader revoked" || msg == "leader fenced" || msg == "stopping":
		if shard != nil {
			delete(p.outboxLed[outbox], *shard)
		} else {
			delete(p.outboxLed, outbox)
		}
	}
}

// leads reports whether the reaper's log says it publishes a shard of outbox now.
func (p *reaper) leads(outbox string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.outboxLed[outbox]) > 0
}

// unloggedLoss is a shard the election took from a reaper whose harvester never said it lost it.
type unloggedLoss struct {
	shard             int
	acquired, revoked time.Time
}

// notLogged records, when the election gives shard again, a loss of it that the harvester did
// not log. The caller holds p.mu.
func (p *reaper) notLogged(shard int) {
	if revoked, ok := p.pending[shard]; ok {
		p.unlogged = append(p.unlogged, unloggedLoss{shard: shard, acquired: p.led[shard], revoked: revoked})
		delete(p.pending, shard)
		delete(p.led, shard)
	}
}

// checkLossesLogged fails the test for every shard the election took from one of ps whose
// harvester logged "leader acquired" and then neither "leader revoked" nor "leader fenced".
func (r *rig) checkLossesLogged(ps ...*reaper) {
	r.t.Helper()
	for _, p := range ps {
		p.mu.Lock()
		unlogged := slices.Clone(p.unlogged)
		for shard, revoked := range p.pending {
			if time.Since(revoked) > 5*time.Second {
				unlogged = append(unlogged, unloggedLoss{shard: shard, acquired: p.led[shard], revoked: revoked})
			}
		}
		p.mu.Unlock()
		for _, u := range unlogged {
			r.t.Errorf("%s: shard %d: \"leader acquired\" at %s, \"leadership revoked\" (the election) at %s, and no \"leader revoked\" or \"leader fenced\" for it in between",
				p.name, u.shard, u.acquired.Format("15:04:05.000"), u.revoked.Format("15:04:05.000"))
		}
	}
}

// loseAll records the loss of every shard the reaper leads. The caller holds p.mu.
func (p *reaper) loseAll(at time.Time) {
	for shard := range p.led {
		p.history = append(p.history, shardEvent{shard: shard, at: at})
	}
	clear(p.led)
	clear(p.granted)
	clear(p.pending)
}

func (p *reaper) isLeading() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.led) > 0
}

// shards returns the shards the reaper's log says it publishes now, in order: those its harvester
// acquired and its election still grants (see checkLossesLogged for when they differ).
func (p *reaper) shards() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []int
	for shard := range p.led {
		if p.granted[shard] {
			out = append(out, shard)
		}
	}
	slices.Sort(out)
	return out
}

// acquiredAfter returns when the reaper's log first says it acquired shard after t, or the zero time.
func (p *reaper) acquiredAfter(shard int, t time.Time) time.Time {
	return p.firstAfter(false, shard, true, t)
}

// assignedAfter returns when the election first gave the reaper shard after t, or the zero time.
func (p *reaper) assignedAfter(shard int, t time.Time) time.Time {
	return p.firstAfter(true, shard, true, t)
}

// lostAfter returns when the reaper's log first says it lost shard after t, or the zero time.
func (p *reaper) lostAfter(shard int, t time.Time) time.Time {
	return p.firstAfter(false, shard, false, t)
}

// firstAfter looks through the election's assignments, or else the log's acquisitions and losses.
func (p *reaper) firstAfter(election bool, shard int, acquired bool, t time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	events := p.history
	if election {
		events = p.assigned
	}
	for _, e := range events {
		if e.shard == shard && e.acquired == acquired && e.at.After(t) {
			return e.at
		}
	}
	return time.Time{}
}

func (p *reaper) lastAcquired() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.acquired) == 0 {
		return time.Time{}
	}
	return p.acquired[len(p.acquired)-1]
}

func (p *reaper) signal(sig syscall.Signal) { p.cmd.Process.Signal(sig) }

// end sends sig and waits for the process to exit; after SIGTERM it must exit 0.
func (p *reaper) end(t *testing.T, sig syscall.Signal) {
	t.Helper()
	p.signal(sig)
	if code := p.waitExit(t, 30*time.Second); sig == syscall.SIGTERM && code != 0 {
		t.Fatalf("%s exited %d after SIGTERM", p.name, code)
	}
}

// waitExit waits for the process to exit and returns its exit code (-1 if killed).
func (p *reaper) waitExit(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(within):
		t.Fatalf("%s did not exit within %v", p.name, within)
		return 0
	}
}

// askReady asks p's /readyz and returns its status; the test fails unless it answers within the
// 3s its checks may take.
func (p *reaper) askReady(t *testing.T) int {
	t.Helper()
	addr := p.admin.Load()
	if addr == nil {
		t.Fatalf("%s never logged its status page's address", p.name)
	}
	asked := time.Now()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get("http://" + *addr + "/readyz")
	if err != nil {
		t.Fatalf("%s: /readyz: %v", p.name, err)
	}
	resp.Body.Close()
	took := time.Since(asked)
	t.Logf("%s: /readyz answered %d after %v", p.name, resp.StatusCode, took.Round(time.Millisecond))
	if took > 3*time.Second+500*time.Millisecond {
		t.Errorf("%s: /readyz answered after %v; it waits at most 3s for its checks", p.name, took)
	}
	return resp.StatusCode
}

// waitLeader waits until exactly one of ps leads and returns it.
func waitLeader(t *testing.T, within time.Duration, ps ...*reaper) *reaper {
	t.Helper()
	var leader *reaper
	// Every 5ms: the chaos figures time elections by it.
	if !testwait.UntilEvery(within, 5*time.Millisecond, func() bool {
		var leaders []*reaper
		for _, p := range ps {
			if p.isLeading() {
				leaders = append(leaders, p)
			}
		}
		if len(leaders) == 1 {
			leader = leaders[0]
		}
		return len(leaders) == 1
	}) {
		t.Fatalf("no single leader among %d reapers within %v", len(ps), within)
	}
	return leader
}

// waitProgress waits until at least n more records have been published.
func (r *rig) waitProgress(n int64, within time.Duration) {
	r.t.Helper()
	r.v.WaitDistinct(r.t, r.distinct()+n, within)
}

func (r *rig) distinct() int64 { return r.v.Distinct() }

// figure logs a scenario's result line; make chaos collects these lines for README.
func figure(t *testing.T, scenario, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf("FIGURE %s: "+format, append([]any{scenario}, args...)...)
	t.Log(line)
	if path := os.Getenv("GOHARVEST_CHAOS_FIGURES"); path != "" {
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
}

// EnvKafkaClient sets the reapers' harvest.kafkaClient ("librdkafka" or "franz"), so that a
// scenario can run on either client; unset, the reapers use the default. make test runs some
// scenarios with each, make chaos all of them.
const EnvKafkaClient = "GOHARVEST_TEST_KAFKA_CLIENT"

func kafkaClientYAML() string {
	if client := os.Getenv(EnvKafkaClient); client != "" {
		return "  kafkaClient: " + client + "\n"
	}
	return ""
}

// claimStrategyYAML sets harvest.claimStrategy from GOHARVEST_TEST_CLAIM ("read" or "mark"), so
// that a scenario can run with either strategy; unset, the reapers use the default.
func claimStrategyYAML() string {
	if claim := os.Getenv("GOHARVEST_TEST_CLAIM"); claim != "" {
		return "  claimStrategy: " + claim + "\n"
	}
	return ""
}
