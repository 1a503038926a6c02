package epoch

import (
	"time"

	"github.com/goharvest/goharvest/internal/timing"
)

// Limits are goharvest.Limits as the engine reads them, after defaults and validation: the root
// package converts one into the other (goharvest.Limits documents each field), so the two
// declare the same fields in the same order, which the conversion checks at compile time.
type Limits struct {
	IOErrorBackoff        time.Duration
	PollDuration          time.Duration
	MinPollInterval       time.Duration
	MaxPollInterval       time.Duration
	HeartbeatTimeout      time.Duration
	DrainInterval         time.Duration
	QueueTimeout          time.Duration
	MarkBackoff           time.Duration
	MaxMarkBackoff        time.Duration
	MaxInFlightRecords    int
	MaxKeyRun             int
	SendConcurrency       int
	SendBuffer            int
	MarkQueryRecords      int
	MinMetricsInterval    time.Duration
	BacklogSampleInterval time.Duration
	HeldCheckInterval     time.Duration
	DeadLetterAttempts    int
	DeadLetterAfter       time.Duration
	AwaitStandbys         int
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
	DefaultMaxInFlightRecords    = 2000
	DefaultMaxKeyRun             = 1
	DefaultSendConcurrency       = 8
	DefaultSendBuffer            = 10
	DefaultMarkQueryRecords      = 500
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
