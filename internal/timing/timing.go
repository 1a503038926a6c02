// Package timing holds the defaults and ranges of the leader election's durations. goharvest's
// Limits and package neli's Config both expose them, and a harvester passes its Limits on to
// neli, so the two must agree: each default, range and rule between them is written here once.
package timing

import (
	"fmt"
	"time"
)

// Defaults of the election's durations.
const (
	DefaultHeartbeatTimeout = 5 * time.Second
	DefaultPollDuration     = time.Millisecond
	DefaultMinPollInterval  = 100 * time.Millisecond
)

// Range is the interval a duration must lie in, bounds included, before the rules that relate it
// to other durations (see Election.Problems).
type Range struct{ Min, Max time.Duration }

// Ranges of the election's durations.
var (
	// HeartbeatTimeout: below 100ms a leader would fence itself on an ordinary network hiccup;
	// above 10m a dead leader would stall the outbox for longer than any operator would wait.
	HeartbeatTimeout = Range{Min: 100 * time.Millisecond, Max: 10 * time.Minute}
	// PollDuration: librdkafka polls in whole milliseconds. It is also at most MinPollInterval.
	PollDuration = Range{Min: time.Millisecond, Max: 10 * time.Minute}
)

// Election holds the durations that goharvest and neli share, under the names both give them.
type Election struct {
	HeartbeatTimeout time.Duration
	PollDuration     time.Duration
	MinPollInterval  time.Duration
}

// WithDefaults returns a copy of e in which every zero field holds its default.
func (e Election) WithDefaults() Election {
	if e.HeartbeatTimeout == 0 {
		e.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if e.PollDuration == 0 {
		e.PollDuration = DefaultPollDuration
	}
	if e.MinPollInterval == 0 {
		e.MinPollInterval = DefaultMinPollInterval
	}
	return e
}

// MaxMinPollInterval is the longest MinPollInterval a heartbeat timeout allows: below half of it
// (by a millisecond, librdkafka's unit), so that a leader publishes, and has acknowledged,
// several heartbeats within each timeout.
func MaxMinPollInterval(heartbeatTimeout time.Duration) time.Duration {
	return heartbeatTimeout/2 - time.Millisecond
}

// Problem is one duration out of its range: the field, as Election names it, its value, and the
// range with the reason for it ("out of range [1ms, 2.499s]: must be ...").
type Problem struct {
	Field  string
	Value  time.Duration
	Reason string
}

// Problems checks e, whose defaults have been applied, and returns every field out of range.
func (e Election) Problems() []Problem {
	var problems []Problem
	between := func(field string, v, lo, hi time.Duration, why string) {
		if v < lo || v > hi {
			reason := fmt.Sprintf("out of range [%v, %v]", lo, hi)
			if why != "" {
				reason += ": " + why
			}
			problems = append(problems, Problem{Field: field, Value: v, Reason: reason})
		}
	}
	between("HeartbeatTimeout", e.HeartbeatTimeout, HeartbeatTimeout.Min, HeartbeatTimeout.Max, "")
	between("PollDuration", e.PollDuration, PollDuration.Min, PollDuration.Max, "")
	between("MinPollInterval", e.MinPollInterval, e.PollDuration, MaxMinPollInterval(e.HeartbeatTimeout),
		"must be at least pollDuration and below half of heartbeatTimeout, so that several heartbeats go out within each timeout")
	return problems
}
