package epoch

import (
	"fmt"
	"strings"
	"time"

	"github.com/goharvest/goharvest/internal/timing"
)

// Limits tunes the harvester's timing and throughput: goharvest.Limits, which names this type.
// The zero value of every field means its documented default; WithDefaults applies them and
// Validate checks each field against its range.
type Limits struct {
	// IOErrorBackoff is how long to wait before retrying after a database error.
	// Default: DefaultIOErrorBackoff. Range: 1ms to 10m.
	IOErrorBackoff time.Duration `yaml:"ioErrorBackoff"`

	// PollDuration is how long one poll of the leader-election consumer may block.
	// Default: DefaultPollDuration. Range: 1ms to MinPollInterval.
	PollDuration time.Duration `yaml:"pollDuration"`

	// MinPollInterval is the shortest time between two polls of the leader-election consumer.
	// The leader sends a heartbeat on each, so several must fit within a heartbeat timeout; and
	// MaxPollInterval must be at least this. Default: DefaultMinPollInterval.
	// Range: PollDuration to below HeartbeatTimeout / 2.
	MinPollInterval time.Duration `yaml:"minPollInterval"`

	// MaxPollInterval is the longest the harvester may go without polling the leader-election
	// consumer. When leadership ends (revoked, fenced, a remark, Stop) the harvester waits up to
	// this long for the records it has in flight to be acknowledged and purged before it gives up
	// on them, and a fenced leader must be done before another can be elected; hence the bound.
	// It is also the timeout of each call to librdkafka's transactional API, which cannot be
	// cancelled; a call under way when leadership ends ends by the same deadline, so the whole
	// handover takes about this long at most.
	// Default: HeartbeatTimeout / 2. Range: MinPollInterval to HeartbeatTimeout / 2.
	MaxPollInterval time.Duration `yaml:"maxPollInterval"`

	// HeartbeatTimeout is how long a leader may go without Kafka acknowledging one of its
	// heartbeats before it assumes it has lost its partitions and fences itself. The Kafka session timeout is derived
	// from it (twice this value), so that a leader always fences itself before the group can
	// hand its partitions to another member; the broker's group.min.session.timeout.ms (6s by
	// default in Kafka) therefore requires at least 3s against a default broker.
	// Default: DefaultHeartbeatTimeout. Range: 100ms to 10m.
	HeartbeatTimeout time.Duration `yaml:"heartbeatTimeout"`

	// DrainInterval is the longest the marker waits for room in the pipeline (see
	// MaxInFlightRecords) before it looks again; a purge that makes room wakes it at once.
	// Default: the smaller of MaxPollInterval and QueueTimeout. Range: 1ms to MaxPollInterval.
	DrainInterval time.Duration `yaml:"drainInterval"`

	// QueueTimeout is how long the producer keeps trying to deliver a message before it reports
	// it failed (the producer's delivery timeout: librdkafka's message.timeout.ms, unless the
	// client's properties set that or delivery.timeout.ms). A record whose delivery fails is sent again in the next transaction.
	// The producer's transaction.timeout.ms must be at least this: unless the client's properties set
	// it, it is the larger of this and librdkafka.DefaultTransactionTimeout.
	// Default: DefaultQueueTimeout. Range: DrainInterval to 1h.
	QueueTimeout time.Duration `yaml:"queueTimeout"`

	// MarkBackoff is how long to wait after a mark query that found nothing, or fewer rows than it
	// asked for (the outbox had no more ready), unless a notification ends the wait sooner. Each
	// further empty mark doubles the wait, up to MaxMarkBackoff, so an idle outbox costs few
	// queries. After a mark that found fewer rows than it asked for, the marker also waits for
	// the last quarter of the commit cadence (see CommitCadence) before it marks again.
	// Default: DefaultMarkBackoff. Range: 1ms to MaxMarkBackoff.
	MarkBackoff time.Duration `yaml:"markBackoff"`

	// MaxMarkBackoff bounds the wait between marks of an idle outbox. A notification (see
	// outbox.NotifyChannel) ends the wait at once, so this matters only when none comes: then it bounds
	// how long a record written to an idle outbox may wait to be noticed. An outbox whose
	// notifications are known to cover every write (its table has the notification trigger, and
	// its listening connection works: see driver.CoveringListener) is not polled while idle.
	// Default: DefaultMaxMarkBackoff. Range: MarkBackoff to 1m.
	MaxMarkBackoff time.Duration `yaml:"maxMarkBackoff"`

	// MaxInFlightRecords bounds the records in flight: marked by the leader and not yet purged
	// (or dropped), whether waiting for their key, with Kafka or being purged. It so bounds the
	// memory the harvester uses, whatever the backlog; goharvest's Harvest.InFlightRecords and the
	// goharvest_in_flight_records gauge report the same count. The records of a key held back by
	// a record that cannot be published, from the held one on, do not count (but for the held
	// record while it is sent again), so that held keys never take the budget from the others;
	// each held key keeps in memory only its rows marked before it was held (the marker marks no
	// more). So held keys can take the count past the limit: by one per held record being sent
	// again, and for a moment when a key is released and its rows count again; the marker then
	// marks nothing until purges bring it back under. Default: DefaultMaxInFlightRecords.
	// Range: 1 to 1,000,000.
	MaxInFlightRecords int `yaml:"maxInFlightRecords"`

	// MaxKeyRun bounds how many records of one key a transaction may carry. A key's records with
	// Kafka always belong to one transaction, and its next records wait until that transaction
	// is committed and purged, so with 1 (the default) each key has one record in flight, and a
	// few busy keys get one record each per transaction. A larger value lets a transaction carry
	// a run of a key's records; such a transaction also writes a note listing them in the group
	// LeaderGroupID + goharvest.NoteGroupSuffix (see driver.NotePlace), so that a successor never publishes a run
	// again whole. Raise it only when every consumer reads with isolation.level=read_committed
	// (librdkafka's default, not the Java client's): a consumer that reads uncommitted records
	// sees an aborted run and then its retry, A B A B, where with 1 it sees only A A.
	// Default: DefaultMaxKeyRun. Range: 1 to 10,000.
	MaxKeyRun int `yaml:"maxKeyRun"`

	// CommitCadence bounds how long a transaction waits for more records while the outbox has no
	// more ready: it commits at the next point of the process's grid of this period after its
	// first record joined it (package wakegrid), so within CommitCadence, and the shards of one
	// process commit together. It commits sooner when it is full (the in-flight budget,
	// MaxInFlightRecords, is taken, so nothing more can join until it commits), when a record it
	// carries was claimed twice this long ago (it waited for its key's previous run), and under a
	// backlog (a claim that fills its room), where it commits as soon as it cannot grow, as it
	// did before this setting. At light load the marker claims at most once a cadence too, in its
	// last quarter, rather than on every writer's commit (with shards, each shard hears every
	// writer's commit): a record is committed within a cadence and a quarter of its write (within
	// a cadence when no claim came in that quarter before it), and so are the first records of a
	// burst, which the next claim finds a backlog. A longer cadence puts more records in each
	// transaction and each claim, so fewer commits for the broker and fewer reads and purges for
	// Postgres, and adds up to this much latency; 1ms is no cadence: a transaction commits as
	// soon as nothing more can join it.
	// Stop, or the end of leadership, commits a waiting transaction at once.
	// Default: DefaultCommitCadence. Range: 1ms to 1s.
	CommitCadence time.Duration `yaml:"commitCadence"`

	// SendConcurrency is the number of send workers; records are sharded over them by key.
	// Default: DefaultSendConcurrency. Range: 1 to 1024.
	SendConcurrency int `yaml:"sendConcurrency"`

	// SendBuffer is the capacity of each send worker's queue of marked records.
	// Default: DefaultSendBuffer. Range: 1 to 100,000.
	SendBuffer int `yaml:"sendBuffer"`

	// MarkQueryRecords is the most records one mark query may return.
	// Default: DefaultMarkQueryRecords. Range: 1 to 100,000.
	MarkQueryRecords int `yaml:"markQueryRecords"`

	// MinMetricsInterval is the shortest time between two throughput readings (MeterRead events).
	// Default: DefaultMinMetricsInterval. Range: 1ms to 1h.
	MinMetricsInterval time.Duration `yaml:"minMetricsInterval"`

	// BacklogSampleInterval is how often the leader counts the outbox's backlog and the age of its
	// oldest record, for the metrics. Default: DefaultBacklogSampleInterval. Range: 100ms to 1h.
	BacklogSampleInterval time.Duration `yaml:"backlogSampleInterval"`

	// HeldCheckInterval is how often the leader reads the rows of held records afresh (one query
	// for all of them), so that an operator's fix or delete takes effect within about this long. A
	// held record whose backoff is over is also read at once before it is sent again.
	// Default: DefaultHeldCheckInterval. Range: 10ms to 1m.
	HeldCheckInterval time.Duration `yaml:"heldCheckInterval"`

	// DeadLetterAttempts, when not 0, is how many failed attempts a held record may have before
	// its row is moved into the dead-letter table (see outbox.DeadLetterTable) and its key released.
	// Default: 0, no dead letters. Range: 0 to 1,000,000.
	DeadLetterAttempts int `yaml:"deadLetterAttempts"`

	// DeadLetterAfter, when not 0, is how long a record may be held, from its first failure,
	// before its row is moved into the dead-letter table and its key released.
	// Default: 0, no dead letters. Range: 0, or 1s to 8760h.
	DeadLetterAfter time.Duration `yaml:"deadLetterAfter"`

	// AwaitStandbys, when not 0, is how many standbys must hold (have flushed, as
	// pg_stat_replication shows) a mark before its records are sent, and a purge before the next
	// records of its keys are: so that a standby promoted after its primary failed, under
	// asynchronous replication, republishes no record after a later one of its key, and holds
	// every row that was published. While fewer standbys hold them, publishing waits, and Ready
	// says why. The role needs pg_monitor. Default: 0, no wait. Range: 0 to 64.
	AwaitStandbys int `yaml:"awaitStandbys"`
}

// Defaults of Limits. A zero field takes its default.
const (
	DefaultIOErrorBackoff        = 500 * time.Millisecond
	DefaultPollDuration          = timing.DefaultPollDuration
	DefaultMinPollInterval       = timing.DefaultMinPollInterval
	DefaultHeartbeatTimeout      = timing.DefaultHeartbeatTimeout
	DefaultQueueTimeout          = 30 * time.Second
	DefaultMarkBackoff           = 10 * time.Millisecond
	DefaultMaxMarkBackoff        = time.Second
	DefaultMaxInFlightRecords    = 4000
	DefaultMaxKeyRun             = 1
	DefaultCommitCadence         = 50 * time.Millisecond
	DefaultSendConcurrency       = 8
	DefaultSendBuffer            = 10
	DefaultMarkQueryRecords      = 1000
	DefaultMinMetricsInterval    = 5 * time.Second
	DefaultBacklogSampleInterval = 10 * time.Second
	DefaultHeldCheckInterval     = time.Second
)

// WithDefaults returns a copy of l in which every zero field holds its default.
func (l Limits) WithDefaults() Limits {
	setDefault(&l.IOErrorBackoff, DefaultIOErrorBackoff)
	election := l.election().WithDefaults()
	l.HeartbeatTimeout, l.PollDuration, l.MinPollInterval = election.HeartbeatTimeout, election.PollDuration, election.MinPollInterval
	setDefault(&l.MaxPollInterval, l.HeartbeatTimeout/2)
	setDefault(&l.QueueTimeout, DefaultQueueTimeout)
	setDefault(&l.DrainInterval, min(l.MaxPollInterval, l.QueueTimeout))
	setDefault(&l.MarkBackoff, DefaultMarkBackoff)
	setDefault(&l.MaxMarkBackoff, max(DefaultMaxMarkBackoff, l.MarkBackoff))
	setDefault(&l.MaxInFlightRecords, DefaultMaxInFlightRecords)
	setDefault(&l.MaxKeyRun, DefaultMaxKeyRun)
	setDefault(&l.CommitCadence, DefaultCommitCadence)
	setDefault(&l.SendConcurrency, DefaultSendConcurrency)
	setDefault(&l.SendBuffer, DefaultSendBuffer)
	setDefault(&l.MarkQueryRecords, DefaultMarkQueryRecords)
	setDefault(&l.MinMetricsInterval, DefaultMinMetricsInterval)
	setDefault(&l.BacklogSampleInterval, DefaultBacklogSampleInterval)
	setDefault(&l.HeldCheckInterval, DefaultHeldCheckInterval)
	return l
}

// election returns the durations l shares with package neli, whose defaults and ranges package
// timing holds.
func (l Limits) election() timing.Election {
	return timing.Election{HeartbeatTimeout: l.HeartbeatTimeout, PollDuration: l.PollDuration, MinPollInterval: l.MinPollInterval}
}

func setDefault[T comparable](field *T, def T) {
	var zero T
	if *field == zero {
		*field = def
	}
}

// Validate checks each limit of limits whose defaults have been applied (WithDefaults) against its
// range, and returns every problem, each naming the field and its YAML key; the ranges of the polling and draining limits
// depend on each other, as their comments explain.
func (l Limits) Validate() []error {
	var errs []error
	between := func(field, yamlKey string, v, lo, hi time.Duration, why string) {
		if v < lo || v > hi {
			msg := fmt.Sprintf("%v is out of range [%v, %v]", v, lo, hi)
			if why != "" {
				msg += ": " + why
			}
			errs = append(errs, fmt.Errorf("Limits.%s (limits.%s): %s", field, yamlKey, msg))
		}
	}
	betweenInt := func(field, yamlKey string, v, lo, hi int) {
		if v < lo || v > hi {
			errs = append(errs, fmt.Errorf("Limits.%s (limits.%s): %d is out of range [%d, %d]", field, yamlKey, v, lo, hi))
		}
	}
	between("IOErrorBackoff", "ioErrorBackoff", l.IOErrorBackoff, time.Millisecond, 10*time.Minute, "")
	for _, p := range l.election().Problems() {
		errs = append(errs, fmt.Errorf("Limits.%s (limits.%s): %v is %s", p.Field, lowerFirst(p.Field), p.Value, p.Reason))
	}
	// A leader that loses leadership waits up to MaxPollInterval for its in-flight records; a
	// fenced one must be done before the group can elect another, which takes at least 1.9
	// heartbeat timeouts (see package neli), so half a timeout leaves a safe margin.
	between("MaxPollInterval", "maxPollInterval", l.MaxPollInterval, l.MinPollInterval, l.HeartbeatTimeout/2,
		"must be at least minPollInterval and at most half of heartbeatTimeout, so that a fenced leader has finished before another can be elected")
	// A wait for a drain must end in time for the next poll.
	between("DrainInterval", "drainInterval", l.DrainInterval, time.Millisecond, l.MaxPollInterval,
		"a single wait for in-flight records must end in time for the next poll (maxPollInterval)")
	between("QueueTimeout", "queueTimeout", l.QueueTimeout, l.DrainInterval, time.Hour,
		"must be at least drainInterval")
	between("MarkBackoff", "markBackoff", l.MarkBackoff, time.Millisecond, l.MaxMarkBackoff, "must not exceed maxMarkBackoff")
	between("MaxMarkBackoff", "maxMarkBackoff", l.MaxMarkBackoff, time.Millisecond, time.Minute, "")
	between("MinMetricsInterval", "minMetricsInterval", l.MinMetricsInterval, time.Millisecond, time.Hour, "")
	between("BacklogSampleInterval", "backlogSampleInterval", l.BacklogSampleInterval, 100*time.Millisecond, time.Hour, "")
	betweenInt("MaxInFlightRecords", "maxInFlightRecords", l.MaxInFlightRecords, 1, 1_000_000)
	betweenInt("MaxKeyRun", "maxKeyRun", l.MaxKeyRun, 1, 10_000)
	between("CommitCadence", "commitCadence", l.CommitCadence, time.Millisecond, time.Second, "")
	betweenInt("SendConcurrency", "sendConcurrency", l.SendConcurrency, 1, 1024)
	betweenInt("SendBuffer", "sendBuffer", l.SendBuffer, 1, 100_000)
	betweenInt("MarkQueryRecords", "markQueryRecords", l.MarkQueryRecords, 1, 100_000)
	between("HeldCheckInterval", "heldCheckInterval", l.HeldCheckInterval, 10*time.Millisecond, time.Minute, "")
	betweenInt("DeadLetterAttempts", "deadLetterAttempts", l.DeadLetterAttempts, 0, 1_000_000)
	betweenInt("AwaitStandbys", "awaitStandbys", l.AwaitStandbys, 0, 64)
	// 0 turns dead letters off; a shorter wait than a second would dead-letter records before an
	// operator or a retry could do anything.
	if l.DeadLetterAfter != 0 {
		between("DeadLetterAfter", "deadLetterAfter", l.DeadLetterAfter, time.Second, 8760*time.Hour, "or 0 for no dead letters")
	}
	return errs
}

// lowerFirst turns a Limits field's name into its YAML key.
func lowerFirst(field string) string {
	return strings.ToLower(field[:1]) + field[1:]
}
