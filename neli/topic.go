package neli

// The leader topic: creating it when it is missing, checking this contender may use it, and
// pinging the cluster through it.

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/goharvest/goharvest/internal/leadership"
)

// prepareTopic makes the leader topic ready for the contender to join the group: it exists with
// Config.Partitions partitions, the contender may use it, and the consumer's own metadata shows
// every partition with a leader. A topic just created reaches each broker's metadata at its own
// moment, and a consumer whose metadata lacks it acts on that until its next refresh: as the
// group's leader it would assign no partition of it.
func (n *Neli) prepareTopic(ctx context.Context) error {
	admin, err := kafka.NewAdminClientFromConsumer(n.consumer)
	if err != nil {
		return fmt.Errorf("admin client: %w", err)
	}
	defer admin.Close()
	if err := n.ensureTopic(ctx, admin); err != nil {
		return err
	}
	if err := n.checkPermissions(ctx, admin); err != nil {
		return err
	}
	if err := n.topicShows(n.consumer); err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	return nil
}

// ensureTopic creates the leader topic with Config.Partitions partitions unless it exists, and
// adds partitions to one that has fewer (Kafka cannot take partitions away, so a topic with more
// is an error). A refusal for lack of permission is fatal, with advice; other failures (Kafka
// unreachable) are for retrying.
func (n *Neli) ensureTopic(ctx context.Context, admin *kafka.AdminClient) error {
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
			return n.contender.TopicTooLarge(have)
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
			return n.contender.MayNotCreateTopic(r.Error)
		default:
			return fmt.Errorf("prepare leader topic %s: %w", topic, r.Error)
		}
	}
	return nil
}

// checkPermissions makes sure this contender may read and write the leader topic, before it
// joins the group (see leadership.Contender.MissingPermissions); a broker that does not say is
// not checked.
func (n *Neli) checkPermissions(ctx context.Context, admin *kafka.AdminClient) error {
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
		return &leadership.Permanent{Err: n.contender.Refused(leadership.DescribeTopic, d.Error)}
	default:
		return fmt.Errorf("describe leader topic %s: %w", topic, d.Error)
	}
	if d.AuthorizedOperations == nil {
		return nil
	}
	return n.contender.MissingPermissions(slices.Contains(d.AuthorizedOperations, kafka.ACLOperationRead),
		slices.Contains(d.AuthorizedOperations, kafka.ACLOperationWrite))
}

// topicShows returns an error unless c's metadata shows the leader topic with all its
// partitions, each led by a broker.
func (n *Neli) topicShows(c *kafka.Consumer) error {
	topic := n.cfg.LeaderTopic
	md, err := c.GetMetadata(&topic, false, int(n.cfg.HeartbeatTimeout.Milliseconds()))
	if err != nil {
		return err
	}
	t, ok := md.Topics[topic]
	switch {
	case !ok || t.Error.Code() != kafka.ErrNoError:
		return fmt.Errorf("leader topic %s not in metadata yet (%v)", topic, t.Error)
	case len(t.Partitions) < n.cfg.Partitions:
		return fmt.Errorf("leader topic %s shows %d of its %d partitions in metadata yet", topic, len(t.Partitions), n.cfg.Partitions)
	}
	for _, p := range t.Partitions {
		if p.Leader < 0 || p.Error.Code() != kafka.ErrNoError {
			return fmt.Errorf("leader topic %s partition %d has no leader in metadata yet (%v)", topic, p.ID, p.Error)
		}
	}
	return nil
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
