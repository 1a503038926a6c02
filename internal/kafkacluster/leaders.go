package kafkacluster

// Who leads what: for tests that fault one chosen broker and must know what it held.

import (
	"context"
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Node returns the node with this ID, or nil.
func (c *Cluster) Node(id int) *Node {
	for _, n := range c.nodes {
		if n.ID == id {
			return n
		}
	}
	return nil
}

// metadata returns the metadata of topic, or of every topic (internal ones included) if topic is "".
func (c *Cluster) metadata(topic string) (*kafka.Metadata, error) {
	cm := kafka.ConfigMap{"bootstrap.servers": c.internalAddr(), "log_level": 0}
	admin, err := kafka.NewAdminClient(&cm)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if topic == "" {
		return admin.GetMetadata(nil, true, 10000)
	}
	return admin.GetMetadata(&topic, false, 10000)
}

// Leaders returns the node ID that leads each partition of topic.
func (c *Cluster) Leaders(topic string) (map[int32]int, error) {
	md, err := c.metadata(topic)
	if err != nil {
		return nil, fmt.Errorf("kafkacluster: leaders of %s: %w", topic, err)
	}
	t, ok := md.Topics[topic]
	if !ok || t.Error.Code() != kafka.ErrNoError {
		return nil, fmt.Errorf("kafkacluster: leaders of %s: %v", topic, t.Error)
	}
	leaders := map[int32]int{}
	for _, p := range t.Partitions {
		leaders[p.ID] = int(p.Leader)
	}
	return leaders, nil
}

// CreateTopicLedByOthers creates a topic whose partitions are replicated on every node and led
// (preferred leader) by every node but avoid, in turn: a test can then fault avoid knowing it
// leads none of them.
func (c *Cluster) CreateTopicLedByOthers(name string, partitions, avoid int) error {
	var others []int32
	for _, n := range c.nodes {
		if n.ID != avoid {
			others = append(others, int32(n.ID))
		}
	}
	if len(others) == 0 {
		return fmt.Errorf("kafkacluster: topic %s: no node but %d to lead it", name, avoid)
	}
	assignment := make([][]int32, partitions)
	for p := range assignment {
		first := others[p%len(others)]
		replicas := []int32{first}
		for _, o := range others {
			if o != first {
				replicas = append(replicas, o)
			}
		}
		if c.Node(avoid) != nil {
			replicas = append(replicas, int32(avoid))
		}
		assignment[p] = replicas
	}
	cm := kafka.ConfigMap{"bootstrap.servers": c.internalAddr(), "log_level": 0}
	admin, err := kafka.NewAdminClient(&cm)
	if err != nil {
		return err
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := admin.CreateTopics(ctx, []kafka.TopicSpecification{{Topic: name, NumPartitions: partitions, ReplicaAssignment: assignment}})
	if err != nil {
		return fmt.Errorf("kafkacluster: create topic %s: %w", name, err)
	}
	for _, r := range res {
		if r.Error.Code() != kafka.ErrNoError {
			return fmt.Errorf("kafkacluster: create topic %s: %w", name, r.Error)
		}
	}
	for ctx.Err() == nil {
		if leaders, err := c.Leaders(name); err == nil && len(leaders) == partitions {
			led := true
			for _, l := range leaders {
				led = led && l >= 0 && l != avoid
			}
			if led {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond) // the controller electing the new partitions' leaders
	}
	return fmt.Errorf("kafkacluster: topic %s: partitions without a leader after 30s", name)
}

// WaitInSync waits until every partition of every topic has all its replicas in sync: after a
// node restarts it must catch up before another node may fail, or partitions with
// min.insync.replicas 2 would refuse writes with one replica left in sync.
func (c *Cluster) WaitInSync(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	lagging := "no metadata"
	for time.Now().Before(deadline) {
		md, err := c.metadata("")
		if err != nil {
			lagging = err.Error()
		} else {
			lagging = ""
			for name, t := range md.Topics {
				for _, p := range t.Partitions {
					if p.Leader < 0 || len(p.Isrs) < len(p.Replicas) {
						lagging = fmt.Sprintf("%s-%d: in sync %v of replicas %v, leader %d", name, p.ID, p.Isrs, p.Replicas, p.Leader)
					}
				}
			}
			if lagging == "" {
				return nil
			}
		}
		time.Sleep(250 * time.Millisecond) // a restarted replica catching up
	}
	return fmt.Errorf("kafkacluster: replicas not in sync after %v: %s", timeout, lagging)
}
