package franz_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
)

// The producer keeps the contract on kfake, franz-go's fake cluster, too. Apache Kafka
// (TestFranzProducerContract) is what counts; this run needs neither Java nor cgo, so a
// CGO_ENABLED=0 build runs the contract as well, in seconds.
func TestFranzProducerContractOnKfake(t *testing.T) { runContractOnKfake(t) }

// And on a kfake that plays a Kafka 3.9 broker, whose transactions run the first protocol
// (no transaction.version): partitions added with AddPartitionsToTxn, notes after
// AddOffsetsToTxn with TxnOffsetCommit v4. TestFranzProducerContractTV1 runs it on Apache Kafka.
func TestFranzProducerContractOnKfake39(t *testing.T) {
	runContractOnKfake(t, kfake.MaxVersions(kversion.V3_9_0()))
}

// runContractOnKfake runs the producer contract on a kfake cluster of one broker with opts.
func runContractOnKfake(t *testing.T, opts ...kfake.Opt) {
	cluster, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	addr := cluster.ListenAddrs()[0]
	var topics atomic.Int32
	drivertest.RunProducer(t, drivertest.Kafka{
		NewProducer: func(t *testing.T, txnID string) driver.KafkaProducer {
			p, err := franz.New(franz.Config{SeedBrokers: []string{addr}}).NewProducer(driver.ProducerConfig{TransactionalID: txnID,
				DeliveryTimeout: 30 * time.Second, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			return p
		},
		Topic: func(t *testing.T) string {
			return createTopic(t, addr, fmt.Sprintf("contract-%d", topics.Add(1)))
		},
		NoteGroup: func(t *testing.T) string { return fmt.Sprintf("contract-notes-%d", topics.Add(1)) },
		Committed: func(t *testing.T, topic string, want int) []drivertest.Message {
			return kafkatest.ReadCommitted(t, addr, topic, want, 3*time.Second)
		},
	})
}

// plainClient returns a kgo client of the cluster at addr, for a test's own requests, closed when
// the test ends.
func plainClient(t *testing.T, addr string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// createTopic creates topic, of one partition, on the cluster at addr.
func createTopic(t *testing.T, addr, topic string) string {
	t.Helper()
	cl := plainClient(t, addr)
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = topic, 1, 1
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(t.Context(), cl)
	if err == nil && len(resp.Topics) == 1 {
		err = kerr.ErrorForCode(resp.Topics[0].ErrorCode)
	}
	if err != nil {
		t.Fatalf("create topic %s: %v", topic, err)
	}
	return topic
}

// Abandon fails what the producer holds at once, each message reported once with an error, and
// Close then closes Deliveries.
func TestAbandonReportsEveryMessageFailed(t *testing.T) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	addr := cluster.ListenAddrs()[0]
	topic := createTopic(t, addr, "abandoned")
	// A linger of a minute keeps the messages queued until Abandon.
	p, err := franz.New(franz.Config{SeedBrokers: []string{addr}, Linger: time.Minute}).NewProducer(driver.ProducerConfig{
		TransactionalID: "abandon", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := p.InitTransactions(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	const n = 3
	for i := range n {
		if err := kafkatest.Produce(p, driver.Message{Topic: topic, Key: []byte("k"), Value: []byte("v"), Opaque: i}, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	p.Abandon()
	reported := map[any]int{}
	for range n {
		select {
		case d := <-p.Deliveries():
			reported[d.Opaque]++
			if d.Err == nil {
				t.Errorf("message %v reported delivered after Abandon", d.Opaque)
			}
		case <-ctx.Done():
			t.Fatalf("after Abandon, %d of %d messages were reported", len(reported), n)
		}
	}
	p.Close()
	for d := range p.Deliveries() {
		t.Errorf("message %v reported again after Abandon (error %v)", d.Opaque, d.Err)
	}
	if len(reported) != n {
		t.Errorf("reports %v, want each of %d messages once", reported, n)
	}
}
