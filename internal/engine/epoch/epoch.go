// Package epoch publishes one leader epoch of one shard: the pipeline that claims rows, sends
// them to Kafka in transactions and purges them. Package owner starts and ends epochs; this
// package imports no driver: it reaches the outbox and Kafka through package driver.
//
// The pipeline publishes one leader epoch: everything it does carries one leader ID and goes
// through one transactional producer, which is closed before the next epoch starts. The
// producer's InitTransactions fenced every earlier epoch's producer, so nothing from an old
// epoch, in this process or another, can land after this one has begun.
//
//	marker ──> send workers (sharded by key) ──> producer (current transaction)
//	              ^                                   │
//	              │                       transaction loop: note, commit, begin
//	              │                                   │
//	              └──── key finished <── committers (purge) <── committed records
//
// The marker claims batches from the head of the outbox (by reading them, or by marking them:
// see claim.go) while the pipeline has room (the in-flight budget, MaxInFlightRecords: see
// budget), and hands each record to the send worker
// that owns its key. A worker keeps a queue per key, and a key's records with Kafka all belong
// to one transaction: its first record starts a run in the current transaction, and more join
// the run while that transaction stays open (up to MaxKeyRun, and while the note has room; see
// note.go). The key's next run starts only once this run has been committed and purged. The
// transaction loop commits whatever has been produced, continuously (under a backlog as soon as
// the transaction cannot grow, at light load at the commit cadence: see commitDue), and passes
// the committed records to the committers, which purge them in batches (one DELETE for many rows, while the
// next batch gathers) and then tell the workers.
//
// When a commit fails, the transaction is aborted and its runs go back to their workers, which
// send each again from its first record in the next transaction: nothing of an aborted
// transaction was committed, so the worst a consumer can see is a record repeated. A record
// Kafka refused outright is retried with backoff, holding back only its own key. (The reference
// algorithm resets and remarks on every failed delivery because it cannot tell what else of a
// batch was sent; with transactions that churn buys nothing.) A fatal producer error (fenced by
// a newer epoch, say) releases the records and asks for a remark: the owner ends the epoch and
// starts another under a new leader ID, which claims everything not yet purged again, from the
// head, in order.
//
// The stages, one file each: the marker (mark.go, which claims rows through a Claimer: claim.go),
// the send workers (worker.go; the records they own and who writes what of them, flight.go; held
// keys, held.go), the transaction loop and the delivery reader (txn.go), the committers
// (purge.go), failovers (standby.go) and tracing (trace.go). Each piece of mutable state has one
// owner, named where it is declared: a goroutine, or one lock. Stages pass work on
// through mailboxes and wakes (mailbox.go), whose sends never block; the one blocking send, the
// marker's to a worker's inbox, waits only for a worker, which itself waits on nothing but
// txnMu and the producer, each bounded in time.
package epoch

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/trace"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/internal/engine/mailbox"
	"github.com/goharvest/goharvest/internal/outage"
	"github.com/goharvest/goharvest/metric"
)

const (
	// committers is how many purge statements may run at once; with two, one gathers a batch
	// while the other executes.
	committers = 2
	// MaxCommitBatch bounds the ids in one purge or reset statement.
	MaxCommitBatch = 5000
	// maxRetryBackoff bounds the wait before retrying a record Kafka refused.
	maxRetryBackoff = time.Minute
	// busyBackoff is the wait before sending again a record the producer could not take (its
	// queue full, a topic being looked up, a transaction ending).
	busyBackoff = 10 * time.Millisecond
	// txnLinger is the shortest time between the ends of two transactions under load, for an
	// epoch whose harvester has no other busy epoch (see lingerFor): records gather meanwhile, so
	// that each commit (a round trip to the transaction coordinator, and a purge) carries many. A
	// transaction that cannot grow (see activity.stalled) commits at once.
	txnLinger = 10 * time.Millisecond
	// maxLingerEpochs bounds how many busy epochs' worth of txnLinger an epoch waits (see
	// lingerFor).
	maxLingerEpochs = 8
	// maxTxnFailures is how many commits may fail in a row before the epoch ends, and a new
	// producer, under a new leader ID, takes over.
	maxTxnFailures = 3
)

type Deps struct {
	// LeaderID is the epoch's leader ID: every claim of the epoch carries it.
	LeaderID uuid.UUID
	Limits   Limits
	// Store is the outbox (or one shard's view of it), and Features what else it offers.
	Store    driver.Store
	Features driver.Features
	// Claim is how the epoch claims its rows (claim.go); nil takes MarkClaim.
	Claim     Claimer
	Producer  driver.KafkaProducer
	Log       *slog.Logger
	Emit      func(event.Event)
	Meter     *metric.Meter
	DBTrouble *outage.Logger
	Metrics   *Metrics
	// Tracer records a span per published record; nil when tracing is off.
	Tracer trace.Tracer
	// Leading reports whether this harvester may still publish; workers ask before each send.
	Leading func() bool
	// Notes is where this epoch's transactions write their notes.
	Notes driver.NotePlace
	// IDHeader names the header that carries each record's id; "" for none (Config.IDHeader).
	IDHeader string
	// Failures remembers held records' failures across epochs (held.go).
	Failures *Failures
	// Notify reports listening trouble once per outage, across epochs.
	Notify *outage.Logger
	// OnRemark, if set, is called once when the epoch asks for a remark, so that its owner learns
	// of it without watching Remark().
	OnRemark func()
	// BusyEpochs counts the harvester's epochs with a backlog: the marker adds its epoch while
	// its latest claim found rows, and the transaction loop spaces its commits by the count (see
	// lingerFor).
	BusyEpochs *atomic.Int32
}

// Epoch is one epoch's stages and the state they share. Fields not marked otherwise are set
// by Start and only read afterwards.
type Epoch struct {
	Deps

	ctx    context.Context // cancelled to stop marking and sending
	cancel context.CancelFunc
	// flushCtx bounds purges, resets and commits: cancelled only when the epoch's final flush runs
	// out of time, which also interrupts a statement stuck on a locked table.
	flushCtx    context.Context
	flushCancel context.CancelFunc
	// flushDeadline is when the final flush gives up, once stop has begun; every call to the
	// producer's transactional API ends by then (see attempt). Written once, by stop, before it
	// cancels ctx; atomic because every stage reads it.
	flushDeadline atomic.Pointer[time.Time]

	// unpurged lists records committed to Kafka whose purge was given up when the final flush ran
	// out of time (guarded by unpurgedMu): the next epoch purges them before it marks anything.
	unpurgedMu sync.Mutex
	unpurged   []int64

	// txnMu lets workers produce (read lock) or endTxn end a transaction (write lock), never both.
	// gen numbers the current transaction (guarded by txnMu), so that a worker can tell whether a
	// run's transaction is still open. txn holds the records produced in it (guarded by txnMx:
	// workers append to it concurrently under the read lock), and txnOldest the earliest claim of
	// those records (guarded by txnMx; see cadenceDue).
	txnMu     sync.RWMutex
	gen       uint64
	txnMx     sync.Mutex
	txn       []*flight
	txnOldest time.Time
	// produced wakes the transaction loop when a record joins an empty transaction.
	produced mailbox.Wake
	// txnFailures counts commits that failed in a row (guarded by txnMu): retrying in place is
	// right for a passing fault, but a producer whose transactions keep failing is replaced.
	txnFailures int
	// fatal is the producer's fatal error, once it has had one (guarded by txnMu): nothing it
	// still holds can commit, so the epoch's last flush does not try.
	fatal error

	workers  []*sendWorker
	outcomes *mailbox.Mailbox[outcome] // from the transaction loop to the committers; closed by stop

	// budget counts the records in flight, what MaxInFlightRecords bounds (pipeline_mark.go).
	budget budget
	// activity is what decides whether the current transaction can still grow, and awaits the
	// producer's delivery reports (pipeline_txn.go).
	activity activity
	written  mailbox.Wake // wakes an idle marker when records are written
	// covered says that every record written wakes the marker (driver.CoveringListener), which
	// then does not poll an idle outbox; written by the listen loop. wakes counts the listener's
	// wake-ups, and emptyAt is one more than that count as it stood before the marker's latest
	// claim, when that claim found nothing and nothing was in flight or held, else 0: Idle reads
	// the three.
	covered atomic.Bool
	wakes   atomic.Uint64
	emptyAt atomic.Uint64

	remarkOnce sync.Once
	remarkCh   chan struct{} // closed (once, by requestRemark) when the epoch should end with a remark
	// remarkErr says the remark was caused by an error: back off before the next epoch. Set by
	// requestRemark, read by the owner once remarkCh is closed.
	remarkErr atomic.Bool

	held        heldSet        // held records and keys (held.go; guarded by its own lock)
	heldWake    mailbox.Wake   // wakes the held loop
	deadTrouble *outage.Logger // moving rows to the dead-letter table fails

	// server is the database server the epoch has seen (standby.go).
	server epochServer

	// ledger holds the records committed notes list and not yet purged, and how many records the
	// current transaction's note will list besides (guarded by its own lock; note.go).
	ledger ledger

	sending    sync.WaitGroup // marker, listener, workers, transaction loop, held loop
	delivering sync.WaitGroup // delivery reader
	committing sync.WaitGroup // committers
}

// Start starts publishing an epoch with a producer whose InitTransactions has fenced every
// earlier epoch of the shard, and whose notes have been purged (see package owner).
func Start(deps Deps) *Epoch {
	if deps.Claim == nil {
		deps.Claim = MarkClaim(deps.Store, deps.LeaderID)
	}
	ctx, cancel := context.WithCancel(context.Background())
	flushCtx, flushCancel := context.WithCancel(context.Background())
	p := &Epoch{
		Deps:        deps,
		ctx:         ctx,
		cancel:      cancel,
		flushCtx:    flushCtx,
		flushCancel: flushCancel,
		outcomes:    mailbox.New[outcome](),
		budget:      budget{keys: map[string]int{}, room: mailbox.NewWake()},
		activity:    activity{settled: closedChan(), wake: mailbox.NewWake()},
		written:     mailbox.NewWake(),
		produced:    mailbox.NewWake(),
		remarkCh:    make(chan struct{}),
		held:        heldSet{added: mailbox.NewWake()},
		heldWake:    mailbox.NewWake(),
		deadTrouble: &outage.Logger{What: "dead-letter table (held records stay held)"},
	}
	for range deps.Limits.SendConcurrency {
		w := &sendWorker{
			p:      p,
			in:     make(chan *flight, deps.Limits.SendBuffer),
			box:    mailbox.New[workerMsg](),
			queues: map[string]*keyQueue{},
			purged: map[int64]uint64{},
		}
		p.workers = append(p.workers, w)
		p.sending.Go(w.run)
	}
	p.sending.Go(p.markLoop)
	if deps.Features.Listen != nil {
		p.sending.Go(p.listenLoop)
	}
	p.sending.Go(p.txnLoop)
	p.sending.Go(p.heldLoop)
	p.delivering.Go(p.readDeliveries)
	for range committers {
		p.committing.Go(p.commitLoop)
	}
	return p
}

// Remark returns a channel that is closed when the epoch should end and a new leader ID begin.
func (p *Epoch) Remark() <-chan struct{} { return p.remarkCh }

// RemarkedOnError reports whether the remark was asked for because of an error, after which the
// owner backs off before the next epoch. Read it once Remark's channel is closed.
func (p *Epoch) RemarkedOnError() bool { return p.remarkErr.Load() }

func (p *Epoch) requestRemark(reason string, err error) {
	if err != nil {
		p.remarkErr.Store(true)
	}
	p.remarkOnce.Do(func() {
		p.Log.Info("remark requested", "reason", reason, "error", err, "leaderID", p.LeaderID)
		close(p.remarkCh)
		if p.OnRemark != nil {
			p.OnRemark()
		}
	})
}

// Stop ends the epoch: it stops marking and sending, commits the current transaction (or aborts
// it when time runs out), commits the purges and resets that gathered, and returns the ids of
// records committed to Kafka whose purge it had to give up. It returns within about timeout (see
// neli/doc.go for why that matters): every wait below ends by the same deadline, and so does a
// call to the producer's transactional API already under way, which was given at most timeout
// when it began (see attempt). The producer is closed in the background, since closing it may
// wait for a topic lookup; closed is closed once it is.
//
// The order matters: the senders stop first, so that Stop, ending the last transaction, is the
// only one to touch txnMu's state; the committers then take the last outcomes; the delivery
// reader ends only once the producer is closed, since that closes its channel.
func (p *Epoch) Stop(timeout time.Duration) (unpurged Unpurged, closed <-chan struct{}) {
	deadline := time.Now().Add(timeout)
	p.flushDeadline.Store(&deadline)
	giveUp := time.AfterFunc(timeout, p.flushCancel)
	defer giveUp.Stop()
	defer p.flushCancel()

	p.cancel()
	p.sending.Wait()
	p.endTxn(p.flushCtx, false)

	if !p.activity.awaitReports(deadline) {
		p.Log.Warn("in-flight records not reported in time; abandoning them (they will be published again)",
			"records", p.activity.unreportedCount(), "waited", timeout)
		p.Producer.Abandon()
	}
	p.outcomes.Close()
	p.committing.Wait()

	done := make(chan struct{})
	go func() {
		defer close(done)
		p.Producer.Close()
		p.delivering.Wait()
	}()
	p.unpurgedMu.Lock()
	defer p.unpurgedMu.Unlock()
	return Unpurged{IDs: p.unpurged, Server: p.epochServerOf()}, done
}

// Unpurged lists the records an epoch committed to Kafka and could not purge, and the database
// server it read them from ("" when the binding cannot tell servers apart): the next epoch purges
// them on that server only (driver.WithServer), since on another one their ids can name other rows.
type Unpurged struct {
	IDs    []int64
	Server string
}

// InFlight returns the keys of the records in flight (see budget), each once, and how many
// records that is.
func (p *Epoch) InFlight() (keys []string, records int) { return p.budget.snapshot() }

// Idle reports whether the outbox's rows of this epoch's shard are known to be none, without
// asking the database: the marker's latest claim found nothing, with nothing in flight or held,
// and no notification has come since, while notifications cover every write. The backlog
// sampler then need not query (and so need not hold a connection).
func (p *Epoch) Idle() bool {
	return p.covered.Load() && p.emptyAt.Load() == p.wakes.Load()+1
}

// Unauthorized describes, one line per topic, the records held back because Kafka does not let
// this client write their topic; empty when none are.
func (p *Epoch) Unauthorized() []string {
	refused := p.held.unauthorized()
	lines := make([]string, 0, len(refused))
	for _, topic := range slices.Sorted(maps.Keys(refused)) {
		r := refused[topic]
		lines = append(lines, fmt.Sprintf("%d records of topic %s held back: %s", r.records, topic, r.err))
	}
	return lines
}

// Held returns the records that hold back their keys now, oldest first.
func (p *Epoch) Held() []event.HeldRecord { return p.held.list() }
