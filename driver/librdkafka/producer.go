package librdkafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/rdlog"
	"github.com/goharvest/goharvest/internal/topiccheck"
	"github.com/goharvest/goharvest/outbox"
)

// initError classifies a failed InitTransactions of the producer with transactional ID txnID:
// the refusals of KafkaConfigError, or a TxnError.
func initError(txnID string, err error) error {
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		switch kerr.Code() {
		case kafka.ErrTransactionalIDAuthorizationFailed:
			// librdkafka's message names neither the ID nor the ACL.
			return &driver.KafkaConfigError{Err: fmt.Errorf("this client may not use transactional ID %q: grant WRITE on TransactionalId %s: %w",
				txnID, txnID, err)}
		case kafka.ErrClusterAuthorizationFailed,
			kafka.ErrInvalidTransactionTimeout, kafka.ErrUnsupportedVersion, kafka.ErrUnsupportedForMessageFormat:
			return &driver.KafkaConfigError{Err: err}
		}
		if kerr.IsFatal() {
			return &driver.KafkaConfigError{Err: err}
		}
	}
	return txnError(err)
}

// txnError turns a confluent-kafka-go error from a transactional call into a TxnError.
func txnError(err error) error {
	var kerr kafka.Error
	if err == nil || !errors.As(err, &kerr) {
		return err
	}
	return &driver.TxnError{Err: err, Retriable: kerr.IsRetriable(), Abortable: kerr.TxnRequiresAbort(), Fatal: kerr.IsFatal()}
}

// newProducer creates a producer with the given librdkafka properties.
func newProducer(config map[string]any, logger *slog.Logger) (*confluentProducer, error) {
	cm := kafka.ConfigMap{}
	for k, v := range config {
		cm[k] = v
	}
	rdlog.Enable(cm)
	p, err := kafka.NewProducer(&cm)
	if err != nil {
		return nil, fmt.Errorf("create producer: %w", err)
	}
	rdlog.Forward(p.Logs(), logger)
	txnID, _ := config["transactional.id"].(string)
	cp := &confluentProducer{p: p, txnID: txnID, deliveries: make(chan driver.Delivery, 1024), log: logger}
	cp.topics = topiccheck.New(cp.describe)
	go cp.forward()
	return cp, nil
}

type confluentProducer struct {
	p          *kafka.Producer
	txnID      string
	deliveries chan driver.Delivery
	log        *slog.Logger

	topics *topiccheck.Checker // what the producer learnt of each message's topic; see checkTopic

	commitMu sync.Mutex
	// commitTime is the time the first call with a deadline of the commit under way was given
	// (the last call to CommitTransaction returned a retriable error, having run out of time,
	// say), or 0 when no commit is under way; see CommitTransaction. Guarded by commitMu.
	commitTime time.Duration
}

// metadataTimeout bounds one metadata request.
const metadataTimeout = 5 * time.Second

// checkTopic rejects a message for a topic that cannot exist or does not: librdkafka would hold
// such a message until topic.metadata.propagation.max.ms passes, and a transaction holding it
// could not commit meanwhile, stalling every other key. Asking for the topic's metadata also
// lets the broker create it where that is allowed. topiccheck remembers what it learnt and asks
// in the background.
func (c *confluentProducer) checkTopic(topic string) error {
	if err := outbox.CheckName(topic); err != nil {
		return &driver.RejectedError{Err: fmt.Errorf("topic %q is not a valid Kafka topic name: %w", topic, err), ByGoharvest: true}
	}
	return c.topics.Check(topic)
}

// describe asks Kafka for a topic's metadata once, for topiccheck: nil if usable, a
// RejectedError if missing or forbidden, and nil when Kafka did not answer (the produce itself
// will show what is wrong).
func (c *confluentProducer) describe(topic string) error {
	md, err := c.p.GetMetadata(&topic, false, int(metadataTimeout.Milliseconds()))
	if err != nil {
		return nil // no answer: not a reason to refuse the message
	}
	t, ok := md.Topics[topic]
	switch {
	case ok && t.Error.Code() == kafka.ErrTopicAuthorizationFailed:
		// Kafka hides from a client without DESCRIBE whether the topic exists; WRITE implies it.
		return &driver.RejectedError{Err: fmt.Errorf("topic %q: this client may not see or write to it (Kafka's metadata: %s): grant WRITE on topic %s",
			topic, t.Error, topic), ByGoharvest: true, Unauthorized: true}
	case !ok || t.Error.Code() != kafka.ErrNoError || len(t.Partitions) == 0:
		reason := "missing"
		if ok && t.Error.Code() != kafka.ErrNoError {
			reason = t.Error.String()
		}
		return &driver.RejectedError{Err: fmt.Errorf("topic %q does not exist and was not created (Kafka's metadata: %s)", topic, reason),
			ByGoharvest: true}
	}
	return nil
}

// forward turns librdkafka's delivery reports into Deliveries until Close closes Events.
func (c *confluentProducer) forward() {
	defer close(c.deliveries)
	for ev := range c.p.Events() {
		switch e := ev.(type) {
		case *kafka.Message:
			err := classify(e.TopicPartition.Error)
			var kerr kafka.Error
			if errors.As(err, &kerr) && kerr.Code() == kafka.ErrTopicAuthorizationFailed && e.TopicPartition.Topic != nil {
				// A client with DESCRIBE on the topic and not WRITE gets this far; Kafka's message
				// names neither the topic nor the ACL.
				topic := *e.TopicPartition.Topic
				err = &driver.RejectedError{Err: fmt.Errorf("this client may not write to topic %q: grant WRITE on topic %s: %w", topic, topic, kerr), Unauthorized: true}
			}
			c.deliveries <- driver.Delivery{Opaque: e.Opaque, Err: err}
		case kafka.Error:
			// Client-level trouble (brokers down, authentication); the messages affected get their
			// own delivery reports.
			c.log.Debug("producer error", "error", e)
		}
	}
}

func (c *confluentProducer) Produce(msg driver.Message) error {
	if err := c.checkTopic(msg.Topic); err != nil {
		return err
	}
	headers := make([]kafka.Header, len(msg.Headers))
	for i, h := range msg.Headers {
		headers[i] = kafka.Header{Key: h.Key, Value: []byte(h.Value)}
	}
	topic := msg.Topic
	err := c.p.Produce(&kafka.Message{
		TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
		Key:            msg.Key,
		Value:          msg.Value,
		Headers:        headers,
		Opaque:         msg.Opaque,
	}, nil)
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		switch kerr.Code() {
		case kafka.ErrQueueFull:
			return driver.ErrQueueFull
		case kafka.ErrState:
			// The transaction is being committed or must be aborted; not the message's fault.
			return &driver.TxnError{Err: err, Retriable: true}
		case kafka.ErrFatal:
			return &driver.TxnError{Err: err, Fatal: true}
		}
	}
	return classify(err)
}

func (c *confluentProducer) Deliveries() <-chan driver.Delivery { return c.deliveries }

// initRetryInterval is how often InitTransactions asks again while the transaction coordinator
// refuses it, as it does (CONCURRENT_TRANSACTIONS) while it aborts a predecessor's transaction.
const initRetryInterval = 100 * time.Millisecond

// InitTransactions calls librdkafka's in slices of initRetryInterval: librdkafka retries a refused
// InitProducerId only after 500ms of its own, while a call resumed after a timeout asks again at
// once, so that a successor starts about as soon as its predecessor's transaction is aborted.
// Without a deadline it makes one call, which librdkafka bounds.
func (c *confluentProducer) InitTransactions(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		return initError(c.txnID, c.p.InitTransactions(ctx))
	}
	for {
		slice, cancel := context.WithTimeout(ctx, initRetryInterval)
		err := c.p.InitTransactions(slice)
		cancel()
		var kerr kafka.Error
		if err == nil || ctx.Err() != nil || !errors.As(err, &kerr) || !(kerr.IsRetriable() || kerr.Code() == kafka.ErrTimedOut) {
			return initError(c.txnID, err)
		}
	}
}

func (c *confluentProducer) BeginTransaction() error { return txnError(c.p.BeginTransaction()) }

// CommitTransaction commits, or resumes the commit that an earlier call left under way when it
// ran out of time. librdkafka's first step of a resumed call must be taken up by its own thread
// within the call's time; when it is not (a timeout near zero, or that thread kept busy), the
// call ends for good and librdkafka forgets that a commit is under way. The commit's EndTxn,
// when Kafka answers it, is then taken for an abort's, and librdkafka asserts and aborts the
// process ("BUG: Invalid transaction state transition attempted: CommittingTransaction ->
// AbortedNotAcked", librdkafka 2.11; TestResumingACommitWithNoTimeLeftKeepsTheProcess). The
// epoch resumes with each attempt's full time, but its last attempt before a deadline can have
// almost none; so a resume given less than half the time its commit's first call had is not
// made, and returns a retriable error, as a call that ran out of time does. The commit stays
// under way, and whatever ends it (a resume with time, the producer's close) finds it known.
func (c *confluentProducer) CommitTransaction(ctx context.Context) error {
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	deadline, hasDeadline := ctx.Deadline() // without one, librdkafka waits as long as it takes
	timeLeft := max(time.Until(deadline), 0)
	if hasDeadline && c.commitTime > 0 && timeLeft < c.commitTime/2 {
		return &driver.TxnError{Retriable: true, Err: fmt.Errorf("commit transaction: %v left is too little to resume the commit under way", timeLeft)}
	}
	err := txnError(c.p.CommitTransaction(ctx))
	var txnErr *driver.TxnError
	switch {
	case !errors.As(err, &txnErr) || !txnErr.Retriable:
		c.commitTime = 0 // committed, or failed for good: no commit under way
	case c.commitTime == 0 && hasDeadline:
		c.commitTime = timeLeft
	}
	return err
}

func (c *confluentProducer) AbortTransaction(ctx context.Context) error {
	return txnError(c.p.AbortTransaction(ctx))
}

func (c *confluentProducer) WriteNote(ctx context.Context, place driver.NotePlace, note string) error {
	// A group without members accepts offsets from a producer that is not one of its consumers;
	// this metadata says so (generation -1, no member ID).
	group, err := kafka.NewTestConsumerGroupMetadata(place.Group)
	if err != nil {
		return fmt.Errorf("note group %q: %w", place.Group, err)
	}
	topic := place.Topic
	offsets := []kafka.TopicPartition{{Topic: &topic, Partition: place.Partition, Offset: 0, Metadata: &note}}
	return txnError(c.p.SendOffsetsToTransaction(ctx, offsets, group))
}

func (c *confluentProducer) ReadNote(ctx context.Context, place driver.NotePlace) (string, error) {
	// Read once per epoch, so the admin client (which shares the producer's connections) lives
	// only for the call.
	admin, err := kafka.NewAdminClientFromProducer(c.p)
	if err != nil {
		return "", fmt.Errorf("read note: %w", err)
	}
	defer admin.Close()
	topic := place.Topic
	res, err := admin.ListConsumerGroupOffsets(ctx, []kafka.ConsumerGroupTopicPartitions{{
		Group: place.Group, Partitions: []kafka.TopicPartition{{Topic: &topic, Partition: place.Partition}},
	}}, kafka.SetAdminRequireStableOffsets(true))
	var kerr kafka.Error
	if errors.As(err, &kerr) && kerr.Code() == kafka.ErrGroupIDNotFound {
		return "", nil // no transaction has written a note yet
	}
	if err != nil {
		return "", noteError(place, err)
	}
	for _, g := range res.ConsumerGroupsTopicPartitions {
		for _, tp := range g.Partitions {
			if tp.Error != nil {
				return "", noteError(place, tp.Error)
			}
			if tp.Metadata != nil && tp.Offset >= 0 {
				return *tp.Metadata, nil
			}
		}
	}
	return "", nil
}

// noteError wraps a failure to read a note. A refusal for lack of permission is a
// KafkaConfigError, with the ACL that would allow it: retrying cannot help, and a leader that
// cannot read its shard's note must not publish it.
func noteError(place driver.NotePlace, err error) error {
	var kerr kafka.Error
	if errors.As(err, &kerr) {
		switch kerr.Code() {
		case kafka.ErrGroupAuthorizationFailed:
			return &driver.KafkaConfigError{Err: fmt.Errorf("this client may not read the notes of group %q: grant READ on group %s: %w",
				place.Group, place.Group, err)}
		case kafka.ErrTopicAuthorizationFailed:
			return &driver.KafkaConfigError{Err: fmt.Errorf("this client may not read the notes of group %q on topic %q: grant READ on topic %s: %w",
				place.Group, place.Topic, place.Topic, err)}
		}
	}
	return fmt.Errorf("read note from group %q: %w", place.Group, err)
}

func (c *confluentProducer) Abandon() {
	c.p.Purge(kafka.PurgeQueue | kafka.PurgeInFlight | kafka.PurgeNonBlocking)
}

func (c *confluentProducer) Close() {
	c.topics.Close() // before the client its lookups ask
	c.p.Close()
}

// classify marks errors that retrying the same message will not cure.
func classify(err error) error {
	var kerr kafka.Error
	if !errors.As(err, &kerr) {
		return err
	}
	switch kerr.Code() {
	case kafka.ErrMsgSizeTooLarge, kafka.ErrRecordListTooLarge, kafka.ErrInvalidMsg, kafka.ErrInvalidRecord,
		kafka.ErrUnknownTopic, kafka.ErrUnknownTopicOrPart, kafka.ErrTopicException,
		kafka.ErrTopicAuthorizationFailed, kafka.ErrPolicyViolation:
		return &driver.RejectedError{Err: kerr}
	}
	return err
}

var _ driver.KafkaProducer = (*confluentProducer)(nil)
