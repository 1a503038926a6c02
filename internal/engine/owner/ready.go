package owner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/outage"
)

// Healthy reports whether the harvester is running and its loop is alive: nil, or why not. It
// makes no network calls, so it suits a liveness probe.
func (h *Owner) Healthy() error {
	if state := h.State(); state != Running {
		return fmt.Errorf("harvest is %v", state)
	}
	// The loop pulses every MinPollInterval, but ending an epoch holds it for up to
	// MaxPollInterval and closing the election longer; two heartbeat timeouts cover both.
	if since := time.Since(time.Unix(0, h.lastPulse.Load())); since > 2*h.cfg.Limits.HeartbeatTimeout {
		return fmt.Errorf("harvest loop has not pulsed for %v", since.Round(time.Millisecond))
	}
	return nil
}

// Ready reports whether the harvester is healthy and can reach both Postgres and Kafka: nil, or
// what is wrong. A standby that is ready can take over at once. It suits a readiness probe.
//
// Answering is not enough for a leader: one whose marks, purges or pre-epoch checks keep
// failing (say, behind a pooler that rejects its statements while it answers pings) publishes
// nothing, and Ready says so, with how long, how many failures and the last error. Such a
// leader publishes nothing, and Ready is what says so: with claimStrategy mark it has no epoch
// running most of the time, so goharvest_leader reads 0 then too; with read (the default) its
// epoch goes on, reading again, and goharvest_leader stays 1.
func (h *Owner) Ready(ctx context.Context) error {
	if err := h.Healthy(); err != nil {
		return err
	}
	var errs []error
	if h.elector.Leading() {
		for _, e := range []*outage.Logger{h.dbTrouble, h.kafkaTrouble} {
			if err := e.Err(); err != nil {
				errs = append(errs, fmt.Errorf("elected leader cannot publish: %w", err))
			}
		}
		h.mu.Lock()
		problem := h.schemaProblem
		h.mu.Unlock()
		if problem != "" {
			errs = append(errs, fmt.Errorf("elected leader cannot publish: the outbox table does not fit: %s", problem))
		}
		// A refused ACL holds back every record of its topic until it is granted: not a bad
		// record, which holds back its key alone (HeldRecords), but a leader that cannot do its job.
		for _, p := range h.epochs() {
			for _, line := range p.Unauthorized() {
				errs = append(errs, fmt.Errorf("elected leader cannot publish: Kafka refuses this client: %s", line))
			}
		}
	}
	if h.onStandby.Load() {
		errs = append(errs, fmt.Errorf("database: %w; not joining the leader election until it does", driver.ErrStandby))
	}
	if p := h.features.Ping; p != nil {
		if err := p.Ping(ctx); err != nil {
			errs = append(errs, fmt.Errorf("database: %w", err))
		}
	}
	if p := h.electorPing; p != nil {
		if err := p.Ping(ctx); err != nil {
			errs = append(errs, fmt.Errorf("kafka: %w", err))
		}
	}
	return errors.Join(errs...)
}
