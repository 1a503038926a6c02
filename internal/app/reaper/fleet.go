package reaper

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fleet is the outboxes a running reaper publishes. serve's loop alone starts, stops and
// replaces them (at start, and at each reload); the admin endpoints read them through list.
type fleet struct {
	env    Env
	cfg    File   // the file as last applied
	file   string // its path, read again at each reload
	only   string // -outbox NAME: the one outbox this reaper runs, or "" for all
	logger *slog.Logger
	// process holds the process's own metrics (Go runtime, CPU, memory); each outbox's are in
	// its harvester's registry.
	process *prometheus.Registry
	// exits carries each harvester once it has stopped, to serve's loop; quit ends the sends
	// once serve has returned.
	exits chan *harvester
	quit  chan struct{}

	mu      sync.Mutex
	current []*harvester // in the file's order
}

// list returns the outboxes as configured now, running or stopped.
func (f *fleet) list() []*harvester {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.current)
}

func (f *fleet) isCurrent(r *harvester) bool {
	return slices.Contains(f.list(), r)
}

// allStopped reports whether every outbox's harvester has stopped.
func (f *fleet) allStopped() bool {
	for _, r := range f.list() {
		if !r.hasStopped() {
			return false
		}
	}
	return true
}

// gatherer gathers the process's metrics and those of every outbox configured at the time.
func (f *fleet) gatherer() prometheus.Gatherer {
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		gatherers := prometheus.Gatherers{f.process}
		for _, r := range f.list() {
			gatherers = append(gatherers, r.registry)
		}
		return gatherers.Gather()
	})
}

// start runs r's harvester and its watch; r is already among the outboxes listed.
func (f *fleet) start(r *harvester) {
	if f.cfg.listed {
		f.logger.Info("outbox starting", "outbox", r.outbox.Name, "line", r.outbox.Line, "leaderGroupID", r.w.cfg.LeaderGroupID,
			"outboxTable", r.w.cfg.OutboxTable, "kafkaClient", r.w.cfg.KafkaClient)
	}
	ctx, cancel := context.WithCancel(f.env.Context)
	// The watch outlives a harvester stopped on an error, so that readiness goes on naming it.
	watchCtx, stopWatch := context.WithCancel(context.Background())
	watched := make(chan struct{})
	r.done = make(chan struct{})
	r.stop = func() {
		cancel()
		<-r.done
		stopWatch()
		<-watched
	}
	go func() {
		defer close(watched)
		r.w.run(watchCtx)
	}()
	go func() {
		err := r.h.Run(ctx)
		r.w.stopped(err)
		r.err = err
		close(r.done)
		select {
		case f.exits <- r:
		case <-f.quit:
		}
	}()
}

// reload reads the file again and applies it to the running reaper: it starts the outboxes the
// file adds, stops those it removes, and restarts those whose settings changed or that had
// stopped on an error; it leaves the others running untouched. A file that does not load, or in
// which any new or changed outbox does not validate, changes nothing, and the log says why.
//
// What a running reaper cannot change, it refuses or leaves: switching between a file with
// outboxes: and one without (their metrics and logs are labelled differently) is refused, and
// changes to admin: and logging: wait for a restart, with a warning.
func (f *fleet) reload() {
	f.logger.Info("reloading the configuration", "config", f.file)
	if err := f.apply(); err != nil {
		f.logger.Error("reload refused; every outbox runs as before", "config", f.file, "error", err)
	}
}

func (f *fleet) apply() error {
	data, err := os.ReadFile(f.file)
	if err != nil {
		return err
	}
	next, err := load(data, f.env.LookupEnv, f.cfg.defaultName)
	if err != nil {
		return err
	}
	if next.listed != f.cfg.listed {
		return errors.New("the reaper started with a file " + map[bool]string{true: "with", false: "without"}[f.cfg.listed] +
			" outboxes:; switching between the two forms needs a restart, as their metrics and logs are labelled differently")
	}
	outboxes, err := next.selected(f.only)
	if err != nil {
		return err
	}

	// Every new or changed outbox's harvester is made before anything stops, so that a mistake
	// in one leaves all as they were.
	running := map[string]*harvester{}
	for _, r := range f.list() {
		running[r.outbox.Name] = r
	}
	var (
		starts, stops []*harvester
		kept          []*harvester
		started       []string
		restarted     []string
		stopped       []string
	)
	for _, o := range outboxes {
		old := running[o.Name]
		delete(running, o.Name)
		if old != nil && old.outbox.same(o) && !old.hasStopped() {
			kept = append(kept, old)
			continue
		}
		r, err := f.newHarvester(o, next)
		if err != nil {
			discard(starts)
			if next.listed {
				return fmt.Errorf("%s: %w", o.where(), err)
			}
			return err
		}
		starts = append(starts, r)
		if old != nil {
			stops = append(stops, old)
			restarted = append(restarted, o.Name)
		} else {
			started = append(started, o.Name)
		}
	}
	for _, old := range running {
		stops = append(stops, old)
		stopped = append(stopped, old.outbox.Name)
	}
	if !reflect.DeepEqual(next.Admin, f.cfg.Admin) || !reflect.DeepEqual(next.Logging, f.cfg.Logging) {
		f.logger.Warn("admin: and logging: changed in the file; they take effect when the reaper restarts")
	}

	// Stop first: an outbox's table or election group may pass to a new outbox of another name.
	// The endpoints see the old list until the new one replaces it whole, in the file's order.
	for _, r := range stops {
		r.stop()
	}
	next.Outboxes = outboxes
	f.cfg.Outboxes, f.cfg.Harvest = next.Outboxes, next.Harvest
	byName := map[string]*harvester{}
	for _, r := range slices.Concat(kept, starts) {
		byName[r.outbox.Name] = r
	}
	current := make([]*harvester, len(outboxes))
	for i, o := range outboxes {
		current[i] = byName[o.Name]
	}
	f.mu.Lock()
	f.current = current
	f.mu.Unlock()
	for _, r := range starts {
		f.start(r)
	}
	slices.Sort(stopped)
	f.logger.Info("configuration reloaded", "started", started, "restarted", restarted, "stopped", stopped, "unchanged", len(kept))
	return nil
}

// hasStopped reports whether the harvester has stopped: on an error, unless the reaper is
// stopping.
func (r *harvester) hasStopped() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// same reports whether two outboxes have the same name and settings; their lines in the file
// may differ.
func (o Outbox) same(other Outbox) bool {
	return o.Name == other.Name && reflect.DeepEqual(o.Harvest, other.Harvest)
}
