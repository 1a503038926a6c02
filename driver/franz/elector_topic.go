package franz

// The leader topic's administration: creating or growing it, checking this contender may use it,
// reading its size, through requests that return by their context's end.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest/internal/leadership"
)

// prepareTopic creates the leader topic with Partitions partitions unless it exists, adds
// partitions to one that has fewer (Kafka cannot take them away, so more is an error), checks
// this contender may read and write it, and returns nil once the metadata shows every partition
// with a leader: a member whose metadata lacks the topic would, as the group's leader, assign no
// partition of it. A refusal for lack of permission is fatal, with advice; anything else that
// outlasts a heartbeat timeout is for the next Pulse to retry.
func (e *elector) prepareTopic(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.HeartbeatTimeout)
	defer cancel()
	topic, want := e.cfg.LeaderTopic, e.cfg.Partitions
	for {
		t, err := e.topicMetadata(ctx)
		if err != nil {
			return fmt.Errorf("metadata: %w", err)
		}
		pending := ""
		switch err := kerr.ErrorForCode(t.ErrorCode); {
		case errors.Is(err, kerr.UnknownTopicOrPartition):
			if err := e.createTopic(ctx); err != nil {
				return err
			}
			pending = "the topic created"
		case errors.Is(err, kerr.TopicAuthorizationFailed):
			return &leadership.Permanent{Err: e.contender.Refused(leadership.DescribeTopic, err)}
		case err != nil:
			return fmt.Errorf("metadata of leader topic %s: %w", topic, err)
		case len(t.Partitions) > want:
			return e.contender.TopicTooLarge(len(t.Partitions))
		case len(t.Partitions) < want:
			if err := e.addPartitions(ctx); err != nil {
				return err
			}
			pending = "the partitions added"
		}
		for _, p := range t.Partitions {
			if pending == "" && (p.Leader < 0 || p.ErrorCode != 0) {
				pending = fmt.Sprintf("partition %d's leader (%v)", p.Partition, kerr.ErrorForCode(p.ErrorCode))
			}
		}
		if pending == "" {
			return e.checkPermissions(t.AuthorizedOperations)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("leader topic %s: the metadata does not show %s yet", topic, pending)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// topicMetadata returns the leader topic's metadata, with the operations this client may perform
// on it (KIP-430). It never creates the topic.
func (e *elector) topicMetadata(ctx context.Context) (*kmsg.MetadataResponseTopic, error) {
	req := kmsg.NewPtrMetadataRequest()
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = kmsg.StringPtr(e.cfg.LeaderTopic)
	req.Topics = append(req.Topics, t)
	req.AllowAutoTopicCreation = false
	req.IncludeTopicAuthorizedOperations = true
	resp, err := request(ctx, e.beats, req)
	if err != nil {
		return nil, err
	}
	if len(resp.Topics) != 1 {
		return nil, fmt.Errorf("metadata of %s: %d topics in the answer", e.cfg.LeaderTopic, len(resp.Topics))
	}
	return &resp.Topics[0], nil
}

// partitionsInTopic asks how many partitions the leader topic has, for a member the group has
// just assigned (kgo calls OnPartitionsAssigned at every rebalance, with nothing new too; see
// leadership.Contender.SizeRead): 0 if Kafka does not say within a quarter of the heartbeat
// timeout, since the rebalance waits for the answer (and Pulse, asking again).
func (e *elector) partitionsInTopic(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.HeartbeatTimeout/4)
	defer cancel()
	t, err := e.topicMetadata(ctx)
	if err != nil || t.ErrorCode != 0 {
		return 0
	}
	return len(t.Partitions)
}

// Kafka's ACL operation codes, as KIP-430's bit field numbers them.
const (
	aclRead  = 3
	aclWrite = 4
)

// checkPermissions makes sure this contender may read and write the leader topic before it joins
// the group (see leadership.Contender.MissingPermissions); ops is KIP-430's bit field. A broker
// that does not say is not checked.
func (e *elector) checkPermissions(ops int32) error {
	if ops == math.MinInt32 {
		return nil
	}
	return e.contender.MissingPermissions(ops&(1<<aclRead) != 0, ops&(1<<aclWrite) != 0)
}

// createTopic creates the leader topic; it may take a moment to show in the metadata.
func (e *elector) createTopic(ctx context.Context) error {
	req := kmsg.NewPtrCreateTopicsRequest()
	t := kmsg.NewCreateTopicsRequestTopic()
	t.Topic, t.NumPartitions, t.ReplicationFactor = e.cfg.LeaderTopic, int32(e.cfg.Partitions), -1
	req.Topics = append(req.Topics, t)
	req.TimeoutMillis = int32(e.cfg.HeartbeatTimeout.Milliseconds())
	resp, err := request(ctx, e.beats, req)
	if err == nil && len(resp.Topics) == 1 {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	return e.topicChanged("create", err)
}

// addPartitions grows the leader topic to Partitions partitions.
func (e *elector) addPartitions(ctx context.Context) error {
	req := kmsg.NewPtrCreatePartitionsRequest()
	t := kmsg.NewCreatePartitionsRequestTopic()
	t.Topic, t.Count = e.cfg.LeaderTopic, int32(e.cfg.Partitions)
	req.Topics = append(req.Topics, t)
	req.TimeoutMillis = int32(e.cfg.HeartbeatTimeout.Milliseconds())
	resp, err := request(ctx, e.beats, req)
	if err == nil && len(resp.Topics) == 1 {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	return e.topicChanged("add partitions to", err)
}

// topicChanged classifies the outcome of creating or growing the leader topic.
func (e *elector) topicChanged(what string, err error) error {
	topic, want := e.cfg.LeaderTopic, e.cfg.Partitions
	switch {
	case err == nil:
		e.log.Info("leader topic ready", "topic", topic, "partitions", want)
	case errors.Is(err, kerr.TopicAlreadyExists):
	case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
		return e.contender.MayNotCreateTopic(err)
	default:
		return fmt.Errorf("%s leader topic %s: %w", what, topic, err)
	}
	return nil
}

// request issues req and returns by ctx's end at the latest: kgo honours ctx while it waits for an
// answer, but not while it connects to a broker (up to its dial timeout, 10s by default), and the
// election must not wait that long inside Pulse. The request goes on in the background then.
func request[Resp kmsg.Response](ctx context.Context, cl *kgo.Client, req interface {
	kmsg.Request
	RequestWith(context.Context, kmsg.Requestor) (Resp, error)
}) (Resp, error) {
	type answer struct {
		resp Resp
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		resp, err := req.RequestWith(ctx, cl)
		done <- answer{resp, err}
	}()
	select {
	case a := <-done:
		return a.resp, a.err
	case <-ctx.Done():
		var zero Resp
		return zero, ctx.Err()
	}
}
