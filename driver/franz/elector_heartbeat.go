package franz

// A leader's heartbeats: sent through the heartbeat client, which lives as long as the
// contender, and their outcomes handed to the contender on the loop (see leadership.Beat for
// what a heartbeat proves).

import (
	"context"
	"errors"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/internal/leadership"
)

// beatResult is a heartbeat's outcome, as kgo's promise posts it for the loop.
type beatResult struct {
	beat leadership.Beat
	err  error
}

// heartbeatOpts configures the heartbeat client. A heartbeat older than the timeout proves
// nothing, so it is given up rather than delivered late; the acknowledgement of the partition's
// leader broker is all the evidence a heartbeat gives (acks=1; see leadership.Beat for why not
// all in-sync replicas), and idempotence, which needs acks=all, has nothing to guard in
// heartbeats. Its metadata keeps kgo's age (5 minutes): kgo refreshes it when a partition's
// leader moves or its broker goes, and a heartbeat to a partition the client does not know yet
// asks for it (see heartbeatFailed). A refresh every heartbeat timeout cost an idle reaper of 50
// outboxes about half a percent of a core.
func (e *elector) heartbeatOpts() []kgo.Opt {
	opts := append([]kgo.Opt{kgo.ClientID(e.cfg.Name + ".heartbeat"), kgo.RetryBackoffFn(backoff(DefaultRetryBackoff, DefaultElectionRetryBackoffMax))}, e.opts...)
	return append(opts,
		kgo.SeedBrokers(e.seeds...),
		kgo.RequiredAcks(kgo.LeaderAck()),
		kgo.DisableIdempotentWrite(),
		kgo.ProducerLinger(0),
		kgo.RecordDeliveryTimeout(e.cfg.HeartbeatTimeout),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.MetadataMinAge(100*time.Millisecond),
		kgo.WithLogger(slogLogger{e.log}),
	)
}

// produceHeartbeat hands one heartbeat of the contender's to the heartbeat client; its outcome
// waits for the loop (see readAcks).
func (e *elector) produceHeartbeat(b leadership.Beat) {
	r := &kgo.Record{Topic: e.cfg.LeaderTopic, Partition: b.Partition, Value: b.Value}
	e.beats.Produce(context.Background(), r, func(_ *kgo.Record, err error) {
		e.acksMu.Lock()
		e.acks = append(e.acks, beatResult{beat: b, err: err})
		e.acksMu.Unlock()
		if err != nil {
			// An acknowledgement can wait for the next Pulse: it counts from when the heartbeat
			// was sent. A failure may call for a retry on partition 0, or stop the election.
			e.poke()
		}
	})
}

// readAcks hands the contender the heartbeats' outcomes posted since the last Pulse. They are
// read here, on the loop, rather than as they come: a leader whose loop stalls must read as
// fenced once the timeout passes, so only the loop may vouch that it still runs.
func (e *elector) readAcks() {
	e.acksMu.Lock()
	acks := e.acks
	e.acks = nil
	e.acksMu.Unlock()
	for _, a := range acks {
		if err := e.contender.Delivered(a.beat, a.err); err != nil {
			e.heartbeatFailed(a.beat, err)
		}
	}
}

// heartbeatFailed handles a heartbeat that Kafka refused or that timed out. WRITE taken away
// while the election runs stops it: Pulse returns the error.
func (e *elector) heartbeatFailed(b leadership.Beat, err error) {
	var kafkaErr *kerr.Error
	if b.Partition != 0 && !errors.As(err, &kafkaErr) && !errors.Is(err, kgo.ErrRecordTimeout) {
		// kgo refused the partition itself: the topic has grown and the client's metadata does
		// not show the new partitions yet (see heartbeatOpts), so it asks for them. Partition 0
		// always exists, and its acknowledgement shows the same. The original send time
		// stands: the acknowledgement still comes after it.
		e.beats.ForceMetadataRefresh()
		e.produceHeartbeat(e.contender.Heartbeat(0, b.SentAt))
		return
	}
	e.contender.HeartbeatFailed(err, errors.Is(err, kerr.TopicAuthorizationFailed))
}
