package kafkacluster

// Who leads what: for tests that fault one chosen broker and must know what it held.

import (
	"fmt"
	"slices"
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
	return c.createTopic(kafka.TopicSpecification{Topic: name, NumPartitions: partitions, ReplicaAssignment: assignment},
		func(ps []kafka.PartitionMetadata) bool {
			return allLed(ps) && !slices.ContainsFunc(ps, func(p kafka.PartitionMetadata) bool { return p.Leader == int32(avoid) })
		})
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
