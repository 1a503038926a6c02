// Command devstack runs a throwaway PostgreSQL and one Apache Kafka node on this machine, to try
// the reaper on real servers: make dev builds it with the reaper and the pump, and runs it.
//
// It starts PostgreSQL from the local server binaries (internal/testkit/pgcluster) and a KRaft node from
// Kafka's jars on Maven Central (internal/testkit/kafkacluster, cached; make kafka fetches them), both on
// loopback ports that were free when they started, with the settings one broker needs
// (replication factor 1 and min ISR 1 for transactions' and groups' internal topics). It prints
// what to export, writes the same to bin/dev.env with a reaper configuration that reads it
// (bin/dev-reaper.yaml), and runs until SIGINT (Ctrl-C) or SIGTERM; then it stops both servers,
// deletes their data and the two files, and exits 0. docs/getting-started.md walks from it to a
// message read back from Kafka.
//
// devstack consume [-n N] TOPIC prints a topic's committed messages from its start: the consumer
// of that walkthrough.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
)

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1
	exitUsage  = 2
)

func main() {
	// Signals are caught until the servers have stopped: a second Ctrl-C does not cut the
	// stopping short and leave PostgreSQL behind.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	var code int
	if len(os.Args) > 1 && os.Args[1] == "consume" {
		code = consumeMain(ctx, os.Args[2:], os.Stdout, os.Stderr)
	} else {
		code = stackMain(ctx, os.Args[1:], os.Stdout, os.Stderr)
	}
	stop()
	os.Exit(code)
}

// The variables bin/dev.env exports, which dev-reaper.yaml reads.
const (
	envDSN     = "GOHARVEST_DEV_DSN"
	envBrokers = "GOHARVEST_DEV_BROKERS"
)

// Files written in -dir while the servers run.
const (
	envFile    = "dev.env"
	reaperFile = "dev-reaper.yaml"
)

// reaperYAML is the reaper configuration for the servers (docs/getting-started.md quotes it).
// Every other setting is the reaper's default; the outbox table is `outbox`, which reaper init
// creates.
const reaperYAML = `harvest:
  baseKafkaConfig:
    bootstrap.servers: ${GOHARVEST_DEV_BROKERS}
  dataSource: ${GOHARVEST_DEV_DSN}
  outboxTable: outbox
  leaderTopic: goharvest-dev.leader
  leaderGroupID: goharvest-dev
logging:
  level: info
`

const stackUsage = `usage:
  devstack [-dir bin] [-database goharvest_dev]
      run a throwaway PostgreSQL and one Apache Kafka node until SIGINT (Ctrl-C) or SIGTERM,
      printing what to export and writing it to DIR/dev.env, with DIR/dev-reaper.yaml
  devstack consume [-brokers ADDR] [-n N] TOPIC
      print TOPIC's committed messages from its start, until N have arrived or Ctrl-C

flags:
`

func stackMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("devstack", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, stackUsage); fs.PrintDefaults() }
	dir := fs.String("dir", "bin", "directory to write "+envFile+" and "+reaperFile+" in (created if absent)")
	database := fs.String("database", "goharvest_dev", "the database to create and name in "+envDSN)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if !databaseName.MatchString(*database) {
		fmt.Fprintf(stderr, "devstack: -database %q: lower-case letters, digits and _, not first a digit\n", *database)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "devstack: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return exitUsage
	}
	if err := runStack(ctx, *dir, *database, stdout); err != nil {
		fmt.Fprintln(stderr, "devstack:", err)
		return exitFailed
	}
	return exitOK
}

// runStack starts the servers, reports them, waits for ctx to end and stops them. Whatever it
// started is stopped on every return, an error's included.
func runStack(ctx context.Context, dir, database string, out io.Writer) (err error) {
	var stops []func() error // run in reverse order
	defer func() {
		for i := len(stops) - 1; i >= 0; i-- {
			err = errors.Join(err, stops[i]())
		}
	}()

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	fmt.Fprintln(out, "Starting a throwaway PostgreSQL...")
	pg, err := pgcluster.StartTCP()
	if err != nil {
		return fmt.Errorf("postgres: %w", err)
	}
	stops = append(stops, func() error {
		fmt.Fprintln(out, "Stopping PostgreSQL...")
		// A fast shutdown (sessions ended, a checkpoint), then the directory removed; Stop alone
		// would kill the server (immediate mode).
		return errors.Join(pg.Halt(), pg.Stop())
	})
	setup, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := pgcluster.Exec(setup, pg.AdminDSN(), "CREATE DATABASE "+database); err != nil {
		return fmt.Errorf("postgres: create database %s: %w", database, err)
	}
	dsn := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=%s sslmode=disable", pg.Port(), database)
	fmt.Fprintf(out, "PostgreSQL: 127.0.0.1:%d, database %s, user postgres (no password)\n", pg.Port(), database)
	if ctx.Err() != nil {
		return nil // stopped while starting
	}

	fmt.Fprintf(out, "Starting Apache Kafka %s, one KRaft node (half a minute or so)...\n", kafkacluster.Version())
	kafka, err := kafkacluster.New()
	if err != nil {
		if ctx.Err() != nil {
			// Ctrl-C at a terminal reaches the Kafka node too, which exits before it is ready.
			fmt.Fprintln(out, "Interrupted while Kafka started.")
			return nil
		}
		return fmt.Errorf("kafka: %w", err)
	}
	stops = append(stops, func() error {
		fmt.Fprintln(out, "Stopping Kafka...")
		// SIGTERM, Kafka's controlled shutdown, as an operator stops a broker; Close kills a node
		// that has not stopped within the timeout, and removes the data.
		for _, n := range kafka.Nodes() {
			n.Terminate(30 * time.Second)
		}
		kafka.Close(false)
		return nil
	})
	brokers := kafka.Addr()
	fmt.Fprintf(out, "Kafka: %s (its log: %s)\n", brokers, kafka.Nodes()[0].LogPath())
	if ctx.Err() != nil {
		return nil
	}

	envPath, reaperPath := filepath.Join(dir, envFile), filepath.Join(dir, reaperFile)
	exports := fmt.Sprintf("export %s=%s\nexport %s=%s\n", envDSN, shellQuote(dsn), envBrokers, shellQuote(brokers))
	if err := os.WriteFile(envPath, []byte("# make dev's servers (cmd/devstack), while it runs\n"+exports), 0o644); err != nil {
		return err
	}
	stops = append(stops, func() error { return os.Remove(envPath) })
	if err := os.WriteFile(reaperPath, []byte(reaperYAML), 0o644); err != nil {
		return err
	}
	stops = append(stops, func() error { return os.Remove(reaperPath) })

	fmt.Fprintf(out, `
Ready. In another shell, run . %s, which exports:

%s
%s is a reaper configuration that reads them:

%s
Then, from this directory (docs/getting-started.md walks through it):

  bin/reaper init -f %s    # creates the table outbox
  bin/reaper -f %s         # publishes its rows until Ctrl-C

Ctrl-C here stops PostgreSQL and Kafka and deletes their data.
`, envPath, indent(exports), reaperPath, indent(reaperYAML), reaperPath, reaperPath)

	<-ctx.Done()
	fmt.Fprintln(out, "Interrupted.")
	return nil
}

// databaseName is what -database accepts: a name that needs no quoting in SQL or a DSN.
var databaseName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func indent(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		b.WriteString("  " + line)
	}
	return b.String()
}
