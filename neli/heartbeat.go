package neli

// The heartbeats: each sent through the heartbeat producer, and its delivery report, the
// acknowledgement a leader needs within the heartbeat timeout, handed back to the contender on
// the loop (see leadership.Beat for what a heartbeat proves).

import (
	"errors"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/goharvest/goharvest/internal/leadership"
)

// sendHeartbeat hands one heartbeat of the contender's to the producer; the Beat travels with
// the message to its delivery report (kafka.Message.Opaque).
func (n *Neli) sendHeartbeat(b leadership.Beat) {
	err := n.produce(b)
	var kerr kafka.Error
	if errors.As(err, &kerr) && kerr.Code() == kafka.ErrUnknownPartition && b.Partition != 0 {
		// The topic has grown and the producer's metadata does not show the new partitions
		// yet (see producerConfig); partition 0 always exists.
		err = n.produce(n.contender.Heartbeat(0, b.SentAt))
	}
	if err != nil {
		n.heartbeatFailed(err)
	}
}

func (n *Neli) produce(b leadership.Beat) error {
	topic := n.cfg.LeaderTopic
	return n.producer.Produce(&kafka.Message{
		TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: b.Partition},
		Value:          b.Value,
		Opaque:         b,
	}, nil)
}

// heartbeatFailed handles a heartbeat that Kafka refused or that timed out. WRITE taken away
// while the election runs stops it, as in handle.
func (n *Neli) heartbeatFailed(err error) {
	var kerr kafka.Error
	n.contender.HeartbeatFailed(err, errors.As(err, &kerr) && kerr.Code() == kafka.ErrTopicAuthorizationFailed)
}

// readDeliveries takes the heartbeats' delivery reports. They are read here, on the loop, rather
// than as they come: a leader whose loop stalls must read as fenced once the timeout passes (see
// State), so only the loop may vouch that it still runs.
func (n *Neli) readDeliveries() {
	for range maxEventsPerPulse {
		select {
		case ev := <-n.producer.Events():
			n.onDelivery(ev)
		default:
			return
		}
	}
}

func (n *Neli) onDelivery(ev kafka.Event) {
	switch e := ev.(type) {
	case *kafka.Message:
		if beat, ok := e.Opaque.(leadership.Beat); ok {
			if err := n.contender.Delivered(beat, e.TopicPartition.Error); err != nil {
				n.heartbeatFailed(err)
			}
		}
	case kafka.Error:
		n.log.Debug("heartbeat producer error", "error", e)
	}
}
