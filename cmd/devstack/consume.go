package main

// devstack consume: the walkthrough's consumer, a few lines of franz-go that print what the
// reaper published.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

func consumeMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("devstack consume", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, stackUsage); fs.PrintDefaults() }
	brokers := fs.String("brokers", os.Getenv(envBrokers), "Kafka bootstrap servers (default: $"+envBrokers+")")
	n := fs.Int("n", 0, "exit once this many messages have arrived (0: at Ctrl-C)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() != 1 || *brokers == "" || *n < 0 {
		fmt.Fprintln(stderr, "devstack consume: name one topic, and the brokers (-brokers or $"+envBrokers+"); -n is at least 0")
		return exitUsage
	}
	if err := consume(ctx, *brokers, fs.Arg(0), *n, stdout, stderr); err != nil {
		fmt.Fprintln(stderr, "devstack consume:", err)
		return exitFailed
	}
	return exitOK
}

// consume prints topic's messages from its start, as a consumer with isolation.level
// read_committed sees them: only those of committed transactions, which is all the reaper's.
func consume(ctx context.Context, brokers, topic string, n int, out, errs io.Writer) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(brokers, ",")...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchIsolationLevel(kgo.ReadCommitted()))
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Fprintf(errs, "reading %s from its start (Ctrl-C to stop)\n", topic)
	for seen := 0; n == 0 || seen < n; {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil // Ctrl-C
		}
		// The errors a fetch reports are retried by the client (a topic not created yet, a
		// leader moving); they are shown, not fatal.
		fetches.EachError(func(t string, p int32, err error) {
			fmt.Fprintf(errs, "%s[%d]: %v (retrying)\n", t, p, err)
		})
		fetches.EachRecord(func(r *kgo.Record) {
			if n > 0 && seen >= n {
				return
			}
			seen++
			fmt.Fprintln(out, describe(r))
		})
	}
	return nil
}

// describe is a message as consume prints it:
// greetings[0]@0 key "order-1" value "hello, Kafka" headers id="1".
func describe(r *kgo.Record) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s[%d]@%d key %s value ", r.Topic, r.Partition, r.Offset, strconv.Quote(string(r.Key)))
	if r.Value == nil {
		b.WriteString("null")
	} else {
		b.WriteString(strconv.Quote(string(r.Value)))
	}
	if len(r.Headers) > 0 {
		b.WriteString(" headers")
		for _, h := range r.Headers {
			fmt.Fprintf(&b, " %s=%s", h.Key, strconv.Quote(string(h.Value)))
		}
	}
	return b.String()
}
