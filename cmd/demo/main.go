// Command demo runs goharvest end to end on one machine: a throwaway Postgres (or -dsn), an
// in-process Kafka-protocol broker (or -brokers), the reaper sidecar and the pump, which writes a
// load and verifies that every record reaches Kafka in per-key order. make demo builds the
// binaries and runs it.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type options struct {
	bin, dsn, brokers string
	records, keys     int
	writers           int
}

func run(ctx context.Context, args []string) error {
	var o options
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.StringVar(&o.bin, "bin", "bin", "directory holding the reaper and pump binaries")
	fs.StringVar(&o.dsn, "dsn", "", "an existing Postgres to use (default: start a throwaway one)")
	fs.StringVar(&o.brokers, "brokers", "", "an existing Kafka to use (default: start an in-process broker)")
	fs.IntVar(&o.records, "records", 50_000, "records the pump writes")
	fs.IntVar(&o.keys, "keys", 1_000, "distinct keys")
	fs.IntVar(&o.writers, "writers", 4, "pump connections")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "goharvest-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	if o.dsn == "" {
		say("starting a throwaway PostgreSQL cluster (default durability)")
		pg, err := pgcluster.StartDurable()
		if err != nil {
			return err
		}
		defer pg.Stop()
		dsn, _, err := pg.CreateDatabase()
		if err != nil {
			return err
		}
		o.dsn = dsn
	}
	if o.brokers == "" {
		broker, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(8, "demo"), kfake.AllowAutoTopicCreation())
		if err != nil {
			return err
		}
		defer broker.Close()
		o.brokers = broker.ListenAddrs()[0]
		say("started an in-process Kafka-protocol broker at %s with topic demo (8 partitions)", o.brokers)
	}

	config := filepath.Join(dir, "reaper.yaml")
	if err := os.WriteFile(config, []byte(`harvest:
  baseKafkaConfig:
    bootstrap.servers: `+o.brokers+`
  leaderTopic: goharvest-demo.leader
  leaderGroupID: goharvest-demo
  dataSource: ${DEMO_DATABASE}
  outboxTable: `+demoTable+`
logging:
  level: info
`), 0o600); err != nil {
		return err
	}
	env := append(os.Environ(), "DEMO_DATABASE="+o.dsn)
	say("reaper config: %s (the data source comes from $DEMO_DATABASE)", config)

	say("reaper init: create the outbox table %s if absent", demoTable)
	if err := command(ctx, filepath.Join(o.bin, "reaper"), env, "reaper", "init", "-f", config).run(); err != nil {
		return fmt.Errorf("reaper init: %w", err)
	}

	say("starting the reaper")
	reaper := command(ctx, filepath.Join(o.bin, "reaper"), env, "reaper", "-f", config)
	if err := reaper.Start(); err != nil {
		return err
	}
	reaperDone := make(chan error, 1)
	go func() { reaperDone <- reaper.wait() }()
	defer func() {
		reaper.Process.Signal(syscall.SIGTERM)
		<-reaperDone
	}()

	say("pump: writing %d records over %d keys, and checking that every one reaches Kafka in order", o.records, o.keys)
	pump := command(ctx, filepath.Join(o.bin, "pump"), env, "pump", "-dsn", o.dsn, "-outbox", demoTable, "-brokers", o.brokers,
		"-topic", "demo", "-records", strconv.Itoa(o.records), "-keys", strconv.Itoa(o.keys), "-writers", strconv.Itoa(o.writers), "-verify")
	pumpErr := pump.run()

	say("stopping the reaper (SIGTERM)")
	reaper.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-reaperDone:
		reaperDone <- err // for the deferred wait
		if err != nil {
			return fmt.Errorf("reaper: %w", err)
		}
	case <-time.After(30 * time.Second):
		return fmt.Errorf("the reaper did not stop within 30s")
	}
	left, err := outboxRows(ctx, o.dsn)
	if err != nil {
		return err
	}
	if pumpErr != nil {
		return fmt.Errorf("verification failed (%v); %d rows left in the outbox", pumpErr, left)
	}
	say("done: %d records written, published in per-key order, nothing lost; %d rows left in the outbox", o.records, left)
	return nil
}

func say(format string, args ...any) {
	stdoutMu.Lock()
	defer stdoutMu.Unlock()
	fmt.Printf("demo   | "+format+"\n", args...)
}

// demoTable is the demo's own outbox, so that a database given with -dsn is never touched
// beyond it.
const demoTable = "goharvest_demo_outbox"

// child is a binary whose output is printed with its name in front, so the streams stay
// readable side by side.
type child struct {
	*exec.Cmd
	out     *io.PipeWriter
	printed chan struct{}
}

func command(ctx context.Context, path string, env []string, name string, args ...string) *child {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = env
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	r, w := io.Pipe()
	cmd.Stdout, cmd.Stderr = w, w
	c := &child{Cmd: cmd, out: w, printed: make(chan struct{})}
	prefix := fmt.Sprintf("%-6s | ", name)
	go func() {
		defer close(c.printed)
		s := bufio.NewScanner(r)
		s.Buffer(make([]byte, 64*1024), 1024*1024)
		for s.Scan() {
			stdoutMu.Lock()
			fmt.Println(prefix + s.Text())
			stdoutMu.Unlock()
		}
	}()
	return c
}

var stdoutMu sync.Mutex

// wait waits for the child to exit and for its last line to be printed.
func (c *child) wait() error {
	err := c.Cmd.Wait()
	c.out.Close()
	<-c.printed
	return err
}

func (c *child) run() error {
	if err := c.Start(); err != nil {
		return err
	}
	return c.wait()
}

func outboxRows(ctx context.Context, dsn string) (int, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var n int
	err = conn.QueryRow(ctx, "SELECT count(*) FROM "+demoTable).Scan(&n)
	return n, err
}
