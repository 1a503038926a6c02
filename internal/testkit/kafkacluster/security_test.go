package kafkacluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// On a Secure cluster a SCRAM user may write to a topic once it has WRITE on it, and not before;
// its clients learn only the client listener's addresses, and a client without TLS and SASL gets
// nowhere.
func TestSecureClusterEnforcesACLs(t *testing.T) {
	c := Start(t, Secure())
	topic := c.Topic(t, "secured", 1)
	c.NewUser(t, "writer")
	c.NewUser(t, "stranger")

	// Each client's metadata lists the brokers at their client listeners, not the internal one.
	admin, err := kafka.NewAdminClient(ptr(c.ConfigMap(t, "writer")))
	if err != nil {
		t.Fatal(err)
	}
	md, err := admin.GetMetadata(nil, false, 10000)
	admin.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range md.Brokers {
		if b.Port != c.Nodes()[b.ID-1].Port {
			t.Errorf("broker %d advertised at %s:%d, not its client listener's port %d", b.ID, b.Host, b.Port, c.Nodes()[b.ID-1].Port)
		}
	}

	if err := produce(c.ConfigMap(t, "stranger"), topic); !isCode(err, kafka.ErrTopicAuthorizationFailed) {
		t.Fatalf("a user without ACLs produced: %v, want TOPIC_AUTHORIZATION_FAILED", err)
	}
	writeACL := ACL{User: "writer", Operation: kafka.ACLOperationWrite, Resource: kafka.ResourceTopic, Name: topic}
	if err := produce(c.ConfigMap(t, "writer"), topic); !isCode(err, kafka.ErrTopicAuthorizationFailed) {
		t.Fatalf("writer produced before its ACL: %v", err)
	}
	if err := c.Grant(writeACL); err != nil {
		t.Fatal(err)
	}
	if err := produce(c.ConfigMap(t, "writer"), topic); err != nil {
		t.Fatalf("writer with WRITE on %s: %v", topic, err)
	}
	if err := produce(c.ConfigMap(t, "stranger"), topic); !isCode(err, kafka.ErrTopicAuthorizationFailed) {
		t.Fatalf("another user produced with writer's ACL: %v", err)
	}
	if err := c.Revoke(writeACL); err != nil {
		t.Fatal(err)
	}
	if err := produce(c.ConfigMap(t, "writer"), topic); !isCode(err, kafka.ErrTopicAuthorizationFailed) {
		t.Fatalf("writer produced after its ACL was revoked: %v", err)
	}

	plain := kafka.ConfigMap{"bootstrap.servers": c.Addr(), "message.timeout.ms": 3000}
	if err := produce(plain, topic); err == nil {
		t.Fatal("a client without TLS and SASL produced")
	}
}

// A TLS cluster serves clients that trust its CA and check its hostname.
func TestTLSClusterServesClientsThatTrustItsCA(t *testing.T) {
	c := Start(t, TLS())
	topic := c.Topic(t, "tls", 1)
	if err := produce(c.ConfigMap(t, ""), topic); err != nil {
		t.Fatalf("over TLS: %v", err)
	}
	untrusting := c.ConfigMap(t, "")
	delete(untrusting, "ssl.ca.location")
	untrusting["message.timeout.ms"] = 3000
	if err := produce(untrusting, topic); err == nil {
		t.Fatal("a client that does not trust the cluster's CA produced")
	}
}

func ptr(cm kafka.ConfigMap) *kafka.ConfigMap { return &cm }

func isCode(err error, code kafka.ErrorCode) bool {
	var kerr kafka.Error
	return errors.As(err, &kerr) && kerr.Code() == code
}

// produce sends one record and returns its delivery's error.
func produce(cm kafka.ConfigMap, topic string) error {
	cm["log_level"] = 0
	if _, ok := cm["message.timeout.ms"]; !ok {
		cm["message.timeout.ms"] = 15000
	}
	p, err := kafka.NewProducer(&cm)
	if err != nil {
		return err
	}
	defer p.Close()
	reports := make(chan kafka.Event, 1)
	if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
		Value: []byte("v")}, reports); err != nil {
		return err
	}
	select {
	case ev := <-reports:
		return ev.(*kafka.Message).TopicPartition.Error
	case <-time.After(30 * time.Second):
		return context.DeadlineExceeded
	}
}
