// Package kafkatest starts an in-process Kafka-protocol broker (kfake) for tests. The broker
// listens on 127.0.0.1, speaks the real wire protocol (so confluent-kafka-go talks to it
// unmodified) and exposes kfake's fault-injection hooks through Cluster.
package kafkatest

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Broker is a single-node in-process Kafka cluster.
type Broker struct {
	*kfake.Cluster
	port         int
	dataDir      string
	opts         []kfake.Opt
	noAutoCreate bool
}

// Option adjusts the broker a test starts.
type Option func(*Broker)

// WithTopics seeds topics with the given number of partitions.
func WithTopics(partitions int32, topics ...string) Option {
	return func(b *Broker) { b.opts = append(b.opts, kfake.SeedTopics(partitions, topics...)) }
}

// WithoutAutoTopicCreation makes the broker refuse to create topics on demand, as production
// clusters often do.
func WithoutAutoTopicCreation() Option {
	return func(b *Broker) { b.noAutoCreate = true }
}

// Start starts a broker that is closed when the test ends. Its log is kept on disk in a test
// directory, so Restart can bring the broker back with its topics, offsets and data. Group
// session timeouts down to 100ms are allowed so that tests of leader election run quickly.
func Start(tb testing.TB, opts ...Option) *Broker {
	tb.Helper()
	b := &Broker{dataDir: tb.TempDir()}
	for _, opt := range opts {
		opt(b)
	}
	if err := b.start(); err != nil {
		tb.Fatalf("kafkatest: start broker: %v", err)
	}
	// Not tb.Cleanup(b.Close): that binds the cluster started here, and after a Restart the
	// cluster running is another one, which would be left running.
	tb.Cleanup(func() { b.Cluster.Close() })
	return b
}

func (b *Broker) start() error {
	opts := append([]kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(b.port),
		kfake.DataDir(b.dataDir),
		kfake.DefaultNumPartitions(1),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond),
	}, b.opts...)
	if !b.noAutoCreate {
		opts = append(opts, kfake.AllowAutoTopicCreation())
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		return err
	}
	b.Cluster = c
	_, port, err := net.SplitHostPort(c.ListenAddrs()[0])
	if err != nil {
		return err
	}
	_, err = fmt.Sscan(port, &b.port)
	return err
}

// Addr returns the bootstrap address, host:port.
func (b *Broker) Addr() string { return b.ListenAddrs()[0] }

// Restart closes the broker, dropping every connection, waits for down, then starts it again on
// the same port with the same data.
func (b *Broker) Restart(down time.Duration) error {
	b.Cluster.Close()
	time.Sleep(down)
	// The port was just released; retry briefly in case the kernel has not let go of it.
	var err error
	for range 50 {
		if err = b.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kafkatest: restart on port %d: %w", b.port, err)
}

// FailProduce makes the broker answer the first of every n produce requests with err (without
// storing the batch, except for REQUEST_TIMED_OUT, which kfake applies before answering, as a
// real broker may), until the fault is removed. The handle counts the requests it failed.
func (b *Broker) FailProduce(n int, err *kerr.Error) *kfake.FaultHandle {
	// kfake may ask When more than once about one request (once per partition it carries), so
	// the decision is made once per request and remembered. When runs on the cluster goroutine
	// only, so these need no lock.
	var (
		seen     int
		last     kmsg.Request
		decision bool
	)
	h := b.Fault(kfake.Fault{
		Keys:  []kmsg.Key{kmsg.Produce},
		Err:   err,
		Count: -1,
		When: func(req kmsg.Request) bool {
			if req != last {
				last = req
				seen++
				decision = (seen-1)%n == 0
			}
			return decision
		},
	})
	return h
}
