package neli

// The leader topic: creating it when it is missing, checking this contender may use it, and
// pinging the cluster through it.

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }

// ensureTopic creates the leader topic with Config.Partitions partitions unless it exists, and
// adds partitions to one that has fewer (Kafka cannot take partitions away, so a topic with more
// is an error). A refusal for lack of permission is fatal, with advice; other failures (Kafka
// unreachable) are for retrying.
func (n *Neli) ensureTopic(ctx context.Context) error {
	admin, err := kafka.NewAdminClientFromConsumer(n.consumer)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	defer admin.Close()
	topic, want := n.cfg.LeaderTopic, n.cfg.Partitions
	md, err := admin.GetMetadata(&topic, false, int(n.cfg.HeartbeatTimeout.Milliseconds()))
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	createCtx, cancel := context.WithTimeout(ctx, n.cfg.HeartbeatTimeout)
	defer cancel()
	var results []kafka.TopicResult
	if t, ok := md.Topics[topic]; ok && t.Error.Code() == kafka.ErrNoError && len(t.Partitions) > 0 {
		switch have := len(t.Partitions); {
		case have == want:
			return nil
		case have > want:
			return &fatalError{fmt.Errorf("neli: leader topic %s has %d partitions, more than the %d configured: "+
				"Kafka cannot remove partitions, so use a new leader topic for fewer (see docs/operations.md, Scaling out)", topic, have, want)}
		}
		results, err = admin.CreatePartitions(createCtx, []kafka.PartitionsSpecification{{Topic: topic, IncreaseTo: want}})
		if err != nil {
			return fmt.Errorf("add partitions to leader topic %s: %w", topic, err)
		}
	} else {
		results, err = admin.CreateTopics(createCtx, []kafka.TopicSpecification{
			{Topic: topic, NumPartitions: want, ReplicationFactor: -1},
		})
		if err != nil {
			return fmt.Errorf("create leader topic %s: %w", topic, err)
		}
	}
	for _, r := range results {
		switch r.Error.Code() {
		case kafka.ErrNoError:
			n.log.Info("leader topic ready", "topic", topic, "partitions", want)
		case kafka.ErrTopicAlreadyExists:
		case kafka.ErrTopicAuthorizationFailed, kafka.ErrClusterAuthorizationFailed:
			return &fatalError{fmt.Errorf("neli: leader topic %s needs %d partition(s) and this client may not create it "+
				"or add partitions (%v): create it with %d partition(s), or grant CREATE and ALTER on it", topic, want, r.Error, want)}
		default:
			return fmt.Errorf("prepare leader topic %s: %w", topic, r.Error)
		}
	}
	return nil
}

// checkPermissions makes sure this contender may read and write the leader topic, before it
// joins the group: without READ it cannot fetch the partitions it is assigned, without WRITE it
// cannot send heartbeats, and either way it would be given partitions, lead each for a heartbeat
// timeout, fence itself and rejoin, for ever. Kafka tells a client which operations it may perform on a topic
// (KIP-430); a broker that does not say is not checked.
func (n *Neli) checkPermissions(ctx context.Context) error {
	admin, err := kafka.NewAdminClientFromConsumer(n.consumer)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	defer admin.Close()
	topic := n.cfg.LeaderTopic
	describeCtx, cancel := context.WithTimeout(ctx, n.cfg.HeartbeatTimeout)
	defer cancel()
	res, err := admin.DescribeTopics(describeCtx, kafka.NewTopicCollectionOfTopicNames([]string{topic}),
		kafka.SetAdminOptionIncludeAuthorizedOperations(true))
	if err != nil {
		return fmt.Errorf("describe leader topic %s: %w", topic, err)
	}
	if len(res.TopicDescriptions) != 1 {
		return fmt.Errorf("describe leader topic %s: %d descriptions", topic, len(res.TopicDescriptions))
	}
	d := res.TopicDescriptions[0]
	switch d.Error.Code() {
	case kafka.ErrNoError:
	case kafka.ErrTopicAuthorizationFailed:
		return &fatalError{n.permissionError("may not describe the leader topic", d.Error, "READ and WRITE on topic "+topic)}
	default:
		return fmt.Errorf("describe leader topic %s: %w", topic, d.Error)
	}
	if d.AuthorizedOperations == nil {
		return nil
	}
	var missing []string
	for _, op := range []kafka.ACLOperation{kafka.ACLOperationRead, kafka.ACLOperationWrite} {
		if !slices.Contains(d.AuthorizedOperations, op) {
			missing = append(missing, op.String())
		}
	}
	if len(missing) > 0 {
		return &fatalError{n.permissionError("may not "+strings.ToLower(strings.Join(missing, " or "))+" the leader topic (to fetch the partitions it is assigned and send heartbeats)",
			nil, strings.Join(missing, " and ")+" on topic "+topic)}
	}
	return nil
}

// permissionError says what this contender may not do, and which ACL would allow it.
func (n *Neli) permissionError(what string, cause error, grant string) error {
	if cause != nil {
		return fmt.Errorf("neli: group %s, leader topic %s: this client %s (%w): grant %s", n.cfg.LeaderGroupID, n.cfg.LeaderTopic, what, cause, grant)
	}
	return fmt.Errorf("neli: group %s, leader topic %s: this client %s: grant %s", n.cfg.LeaderGroupID, n.cfg.LeaderTopic, what, grant)
}

// Ping asks Kafka for the leader topic's metadata, to check that the cluster answers.
func (n *Neli) Ping(ctx context.Context) error {
	timeout := n.cfg.HeartbeatTimeout
	if deadline, ok := ctx.Deadline(); ok {
		timeout = min(timeout, time.Until(deadline))
	}
	topic := n.cfg.LeaderTopic
	// Through the producer, which lives as long as the contender, unlike the consumer (see
	// replaceConsumer); Ping is called from other goroutines than the loop.
	if _, err := n.producer.GetMetadata(&topic, false, max(1, int(timeout.Milliseconds()))); err != nil {
		return fmt.Errorf("kafka metadata: %w", err)
	}
	return nil
}
