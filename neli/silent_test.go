package neli

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// A broker that accepts connections and never answers leaves every request of the election
// waiting (the topic's metadata before joining among them): each Pulse must still return within
// its bounds, the contender must not lead, and Close must return.
func TestSilentKafkaKeepsPulseAndCloseAnswering(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(io.Discard, c); c.Close() }() // reads every request, answers none
		}
	}()
	n, err := New(Config{
		KafkaConfig:      map[string]any{"bootstrap.servers": ln.Addr().String()},
		LeaderTopic:      "silent.leader",
		LeaderGroupID:    "silent",
		Name:             "c0",
		HeartbeatTimeout: testHeartbeatTimeout,
		MinPollInterval:  testPollInterval,
	})
	if err != nil {
		t.Fatal(err)
	}
	// A Pulse waits at most for the topic's metadata, creating it and checking permissions
	// (a heartbeat timeout each) and one poll.
	bound := 3*testHeartbeatTimeout + n.cfg.PollDuration + time.Second
	for range 3 {
		start := time.Now()
		leads, err := n.Pulse(t.Context())
		if took := time.Since(start); took > bound {
			t.Fatalf("Pulse took %v against a silent broker, more than %v", took, bound)
		}
		if err != nil || leads {
			t.Fatalf("Pulse against a silent broker returned leads=%v, err=%v; want a follower riding out the outage", leads, err)
		}
	}
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*testHeartbeatTimeout)
		defer cancel()
		closed <- n.Close(ctx)
	}()
	select {
	case <-closed:
	case <-time.After(4*testHeartbeatTimeout + 10*time.Second):
		t.Fatal("Close did not return against a silent broker")
	}
}
