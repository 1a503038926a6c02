package owner

import (
	"context"
	"time"
)

// awaitPrimary keeps a harvester whose database is a standby out of the leader election, so
// that one whose database accepts writes leads, and lets it join once its database does (after a
// promotion, or once a multi-host data source reaches the primary). A database that does not
// answer is no reason to wait: the harvester joins, as it always has, and Ready reports the
// database. It returns false when Stop was called meanwhile. It runs on the owner goroutine,
// before the first pulse, and keeps the loop's pulse fresh for Healthy.
func (h *Owner) awaitPrimary() bool {
	checker := h.features.Recovery
	if checker == nil {
		return true
	}
	tick := time.NewTicker(h.cfg.Limits.MinPollInterval)
	defer tick.Stop()
	var checked time.Time
	for {
		if time.Since(checked) >= standbyRecheck {
			checked = time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), h.cfg.Limits.MaxPollInterval)
			standby, err := checker.InRecovery(ctx)
			cancel()
			if err != nil || !standby {
				if h.onStandby.Swap(false) {
					h.log.Info("the database accepts writes now; joining the leader election")
				}
				return true
			}
			if !h.onStandby.Swap(true) {
				h.log.Error("the database is a standby (pg_is_in_recovery() is true): not joining the leader election until it accepts writes; " +
					"point dataSource at the primary, or name every host with target_session_attrs=read-write")
			}
		}
		h.lastPulse.Store(time.Now().UnixNano())
		select {
		case <-h.stopCh:
			return false
		case <-tick.C:
		}
	}
}

// standbyRecheck is how often a harvester kept out of the election asks whether its database
// accepts writes yet.
const standbyRecheck = time.Second
