package franz

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/internal/engine/mailbox"
	"github.com/goharvest/goharvest/internal/topiccheck"
	"github.com/goharvest/goharvest/outbox"
)

// producer is a transactional kgo client as a driver.KafkaProducer.
//
// kgo calls each message's promise on a goroutine of its own; the promise posts the Delivery to
// reports, a mailbox that never blocks, and forward hands it on to Deliveries. A transaction's end
// (flush, then EndTxn) runs on a goroutine of its own too, an ending: a call that runs out of time
// leaves it going, and the next call waits for it again, as the contract asks of a commit.
type producer struct {
	cl *kgo.Client
	// newNotes makes the notes client: see notes.
	newNotes   func() (*kgo.Client, error)
	txnID      string
	txnTimeout time.Duration
	maxQueued  int

	// ctx bounds the endings and topic lookups' metadata requests; Close cancels it before it
	// closes the client.
	ctx  context.Context
	stop context.CancelFunc
	ends sync.WaitGroup // endings under way; Close waits for them

	topics *topiccheck.Checker // what the producer learnt of each message's topic; see Produce

	reports    *mailbox.Mailbox[driver.Delivery]
	deliveries chan driver.Delivery

	// mu guards the fields below, which Produce, the transactional calls and kgo's promises
	// share.
	mu sync.Mutex
	// queued counts the messages Produce accepted and kgo has not reported yet; idle is signalled
	// when it drops to zero, which Close waits for.
	queued int
	idle   *sync.Cond
	// inTxn says a transaction is open: begun, and its end not yet succeeded.
	inTxn bool
	// produced counts the messages Produce accepted in the open transaction.
	produced int
	// failure is the first failed delivery of the open transaction; it cannot commit then.
	failure error
	// end is the transaction's end under way, or finished and not yet returned to a caller.
	end *ending
	// fatal, once set, is why the producer is unusable (fenced, say).
	fatal error

	// kip890p2 says the cluster runs KIP-890 part 2 (its transaction.version is 2 or more), as
	// InitTransactions found: kgo then adds partitions by producing, and WriteNote's
	// TxnOffsetCommit (v5 or later) adds the notes group to the transaction itself. Otherwise
	// WriteNote sends AddOffsetsToTxn first, and TxnOffsetCommit on notes. It holds for the
	// producer's life: on a cluster raised to transaction.version 2 meanwhile, kgo opts in at a
	// transaction's end, and the first protocol's notes still commit and abort with the second's
	// transactions (TestFirstTransactionProtocol/TransactionVersionRaisedWhileProducing).
	kip890p2 bool
	// notes is the client WriteNote sends TxnOffsetCommit on when kip890p2 is false, made by
	// InitTransactions then: kgo negotiates the highest version both sides know, and offers no
	// way to pin one request lower, while Kafka 4.x brokers offer TxnOffsetCommit v5 whatever
	// their transaction.version, and v5 without KIP-890 part 2 is not the protocol the broker's
	// transaction runs. Its only request versions held down are TxnOffsetCommit's and EndTxn's,
	// to v4 (see abortNotes). Close closes it.
	notes *kgo.Client
	// offsetsAdded are the groups AddOffsetsToTxn added to the open transaction (kip890p2 false).
	offsetsAdded map[string]bool
	// offsetsAsked says WriteNote sent AddOffsetsToTxn in the open transaction, answered or not:
	// its abort must then end it itself (see abortNotes).
	offsetsAsked bool
}

// ending is a transaction's end, commit or abort, under way on a goroutine of its own.
type ending struct {
	commit bool
	done   chan struct{}
	err    error // written before done is closed
}

func newProducer(cl *kgo.Client, newNotes func() (*kgo.Client, error), txnID string, txnTimeout time.Duration, maxQueued int) *producer {
	ctx, stop := context.WithCancel(context.Background())
	p := &producer{cl: cl, newNotes: newNotes, txnID: txnID, txnTimeout: txnTimeout, maxQueued: maxQueued, ctx: ctx, stop: stop,
		reports: mailbox.New[driver.Delivery](), deliveries: make(chan driver.Delivery, 1024)}
	p.topics = topiccheck.New(p.describe)
	p.idle = sync.NewCond(&p.mu)
	go p.forward()
	return p
}

// InitTransactions finds which transaction protocol the cluster runs (see the package doc), then
// registers the transactional ID: kgo's InitProducerID, which fences every earlier producer of
// the ID and returns once the coordinator has ended their transactions.
func (p *producer) InitTransactions(ctx context.Context) error {
	level, err := p.transactionVersion(ctx)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.kip890p2 = level >= kip890p2Version
	needNotes := !p.kip890p2 && p.notes == nil
	p.mu.Unlock()
	if needNotes {
		notes, err := p.newNotes()
		if err != nil {
			return &driver.KafkaConfigError{Err: fmt.Errorf("create the notes client: %w", err)}
		}
		p.mu.Lock()
		p.notes = notes
		p.mu.Unlock()
	}
	if _, _, err := p.cl.ProducerID(ctx); err != nil {
		return initError(p.txnID, err)
	}
	return nil
}

// kip890p2Version is the cluster's transaction.version from which its transactions run KIP-890
// part 2. kgo takes the same level (and the same answer, ApiVersions' finalized features) when it
// begins a transaction.
const kip890p2Version = 2

// maxTV1Version is the last TxnOffsetCommit and EndTxn version of the first protocol: v5 of
// TxnOffsetCommit adds the group to the transaction itself, and v5 of EndTxn bumps the epoch, both
// KIP-890 part 2's.
const maxTV1Version = 4

// transactionVersion asks the cluster for its transaction.version: 0 when it finalized none (a
// cluster before Kafka 4.0, or upgraded without it).
func (p *producer) transactionVersion(ctx context.Context) (int16, error) {
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(ctx, p.cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
	}
	if err != nil {
		return 0, &driver.TxnError{Err: fmt.Errorf("ask the cluster's transaction.version: %w", err), Retriable: true}
	}
	var level int16
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "transaction.version" {
			level = f.MaxVersionLevel
		}
	}
	return level, nil
}

// initError classifies a failed InitTransactions of the producer with transactional ID txnID:
// the refusals of KafkaConfigError, or a retriable TxnError (a timeout, a broker away).
func initError(txnID string, err error) error {
	switch {
	case errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		return &driver.KafkaConfigError{Err: fmt.Errorf("this client may not use transactional ID %q: grant WRITE on TransactionalId %s: %w",
			txnID, txnID, err)}
	}
	// Kafka's other refusals (CLUSTER_AUTHORIZATION_FAILED, INVALID_TRANSACTION_TIMEOUT, a broker
	// without transactions) are for good too: kgo keeps the error, and the producer is unusable.
	var ke *kerr.Error
	if errors.As(err, &ke) && !ke.Retriable && !errors.Is(err, kerr.ConcurrentTransactions) {
		return &driver.KafkaConfigError{Err: fmt.Errorf("register transactional ID %q: %w", txnID, err)}
	}
	return &driver.TxnError{Err: fmt.Errorf("register transactional ID %q: %w", txnID, err), Retriable: true}
}

func (p *producer) BeginTransaction() error {
	p.mu.Lock()
	err := p.refuse(false)
	p.mu.Unlock()
	if err != nil {
		return err
	}
	if err := p.cl.BeginTransaction(); err != nil {
		// kgo refuses only a producer whose ID failed for good (we never call it in a transaction).
		return p.setFatal(fmt.Errorf("begin transaction: %w", err))
	}
	p.mu.Lock()
	p.inTxn, p.produced, p.failure = true, 0, nil
	clear(p.offsetsAdded)
	p.offsetsAsked = false
	p.mu.Unlock()
	return nil
}

// refuse returns why a call cannot go ahead now, if it cannot: the producer is unusable, a
// transaction's end is under way, or a transaction is open (inTxn false: the call begins one)
// or not (inTxn true: the call needs one). Called with mu held.
func (p *producer) refuse(inTxn bool) error {
	switch {
	case p.fatal != nil:
		return &driver.TxnError{Err: fmt.Errorf("the producer is unusable: %w", p.fatal), Fatal: true}
	case p.end != nil:
		return &driver.TxnError{Err: errors.New("the transaction's end is under way"), Retriable: true}
	case inTxn && !p.inTxn:
		return &driver.TxnError{Err: errors.New("no transaction is open"), Retriable: true}
	case !inTxn && p.inTxn:
		return &driver.TxnError{Err: errors.New("a transaction is already open")}
	}
	return nil
}

// setFatal records that the producer is unusable for err, and returns it as a fatal TxnError.
func (p *producer) setFatal(err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fatal == nil {
		p.fatal = err
	}
	return &driver.TxnError{Err: err, Fatal: true}
}

func (p *producer) Produce(msg driver.Message) error {
	if err := outbox.CheckName(msg.Topic); err != nil {
		return &driver.RejectedError{Err: fmt.Errorf("topic %q is not a valid Kafka topic name: %w", msg.Topic, err), ByGoharvest: true}
	}
	// The producer's state first: a message refused for it starts no topic lookup.
	p.mu.Lock()
	err := p.refuse(true)
	p.mu.Unlock()
	if err != nil {
		return err
	}
	// Refuse a message for a topic that does not exist, as the librdkafka driver does (a name that
	// cannot exist was refused above): kgo would hold such a message while it asks for the
	// topic's metadata again and again, and fail it only after several tries, so the transaction
	// could not commit meanwhile and would then have to abort, taking every other key's records
	// with it. Asking for the topic's metadata also lets the broker create it where that is
	// allowed. topiccheck asks in the background, since Produce must not block.
	if err := p.topics.Check(msg.Topic); err != nil {
		return err
	}
	p.mu.Lock()
	if err := p.refuse(true); err != nil { // again: mu was let go for the topic check
		p.mu.Unlock()
		return err
	}
	if p.failure != nil {
		// The transaction cannot commit (see CommitTransaction); as librdkafka does, take no more
		// messages into it, which would only be published again after its abort.
		err := fmt.Errorf("the transaction must abort: a message of it failed: %w", p.failure)
		p.mu.Unlock()
		return &driver.TxnError{Err: err, Retriable: !fatal(err), Fatal: fatal(err)}
	}
	if p.queued >= p.maxQueued {
		p.mu.Unlock()
		return driver.ErrQueueFull
	}
	p.queued++
	p.produced++
	p.mu.Unlock()

	rec := &kgo.Record{Topic: msg.Topic, Key: msg.Key, Value: msg.Value}
	if len(msg.Headers) > 0 {
		rec.Headers = make([]kgo.RecordHeader, len(msg.Headers))
		for i, h := range msg.Headers {
			rec.Headers[i] = kgo.RecordHeader{Key: h.Key, Value: []byte(h.Value)}
		}
	}
	opaque := msg.Opaque
	// TryProduce never blocks. Nor does it find kgo's buffer full (see NewProducer): kgo's limit
	// is twice maxQueued, and kgo counts a message out only just after its promise, where queued
	// counts it out.
	p.cl.TryProduce(context.Background(), rec, func(r *kgo.Record, err error) { p.delivered(r.Topic, opaque, err) })
	return nil
}

// metadataTimeout bounds one metadata request.
const metadataTimeout = 5 * time.Second

// describe asks Kafka for a topic's metadata once, for topiccheck, letting it create the topic
// where it may: nil if usable, a RejectedError if missing or forbidden, and nil when Kafka did not
// answer (the produce itself will show what is wrong).
func (p *producer) describe(topic string) error {
	ctx, cancel := context.WithTimeout(p.ctx, metadataTimeout)
	defer cancel()
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = true
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, p.cl)
	if err != nil {
		return nil // no answer: not a reason to refuse the message
	}
	var found *kmsg.MetadataResponseTopic
	for i, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == topic {
			found = &resp.Topics[i]
		}
	}
	switch {
	case found != nil && found.ErrorCode == kerr.TopicAuthorizationFailed.Code:
		// Kafka hides from a client without DESCRIBE whether the topic exists; WRITE implies it.
		return &driver.RejectedError{Err: fmt.Errorf("topic %q: this client may not see or write to it (Kafka's metadata: %w): grant WRITE on topic %s",
			topic, kerr.TopicAuthorizationFailed, topic), ByGoharvest: true, Unauthorized: true}
	case found == nil || found.ErrorCode != 0 || len(found.Partitions) == 0:
		reason := error(errors.New("missing"))
		if found != nil && found.ErrorCode != 0 {
			reason = kerr.ErrorForCode(found.ErrorCode)
		}
		return &driver.RejectedError{Err: fmt.Errorf("topic %q does not exist and was not created (Kafka's metadata: %w)", topic, reason),
			ByGoharvest: true}
	}
	return nil
}

// delivered is kgo's promise for a message of topic: it must not block. The report is posted
// before the message stops counting as queued, so that Close, which closes the mailbox once none
// is queued, never drops one.
func (p *producer) delivered(topic string, opaque any, err error) {
	err = deliveryError(topic, err)
	p.reports.Post(driver.Delivery{Opaque: opaque, Err: err})
	p.mu.Lock()
	p.queued--
	if p.queued == 0 {
		p.idle.Broadcast()
	}
	if err != nil && p.failure == nil && p.inTxn {
		p.failure = err
	}
	p.mu.Unlock()
}

// deliveryError marks errors that retrying the same message will not cure.
func deliveryError(topic string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		// kgo's message names neither the topic nor the ACL.
		return &driver.RejectedError{Err: fmt.Errorf("this client may not write to topic %q: grant WRITE on topic %s: %w", topic, topic, err), Unauthorized: true}
	case errors.Is(err, kerr.MessageTooLarge), errors.Is(err, kerr.RecordListTooLarge), errors.Is(err, kerr.InvalidRecord),
		errors.Is(err, kerr.CorruptMessage), errors.Is(err, kerr.UnknownTopicOrPartition), errors.Is(err, kerr.InvalidTopicException),
		errors.Is(err, kerr.PolicyViolation):
		return &driver.RejectedError{Err: err}
	}
	return err
}

func (p *producer) Deliveries() <-chan driver.Delivery { return p.deliveries }

// forward hands reports on to Deliveries, in order, until Close has closed the mailbox and every
// report is handed on.
func (p *producer) forward() {
	defer close(p.deliveries)
	for {
		batch, ok := p.reports.Wait(0)
		if !ok {
			return
		}
		for _, d := range batch {
			p.deliveries <- d
		}
	}
}

// CommitTransaction flushes the transaction's messages and commits it. A transaction in which a
// message failed is not committed (kgo would commit the others): the call returns an abortable
// TxnError, as librdkafka does. Should the commit's outcome be unknown (EndTxn sent and not
// answered), kgo allows only an abort next, so the error is abortable too: the transaction may
// have committed, and the harvester publishes its records again.
func (p *producer) CommitTransaction(ctx context.Context) error { return p.endTxn(ctx, true) }

// AbortTransaction fails the messages not yet sent, waits for those in flight, and aborts.
func (p *producer) AbortTransaction(ctx context.Context) error { return p.endTxn(ctx, false) }

// endTxn starts the transaction's end, or finds the one under way, and waits for it until ctx
// ends; the end goes on meanwhile, and the next call waits for it again.
func (p *producer) endTxn(ctx context.Context, commit bool) error {
	what := map[bool]string{true: "commit", false: "abort"}
	p.mu.Lock()
	e := p.end
	if e != nil && e.commit != commit && closed(e.done) {
		// The other kind of end finished, and its caller gave up waiting; its outcome is in the
		// producer's state now, which this call goes by.
		p.end, e = nil, nil
	}
	switch {
	case e != nil && e.commit != commit:
		p.mu.Unlock()
		return &driver.TxnError{Err: fmt.Errorf("%s transaction: a %s is under way; call again to wait for it", what[commit], what[e.commit]),
			Retriable: true}
	case e == nil && p.fatal == nil && !p.inTxn:
		p.mu.Unlock()
		// Not retriable, unlike Produce's refusal: no transaction will be open until one begins.
		return &driver.TxnError{Err: fmt.Errorf("%s transaction: no transaction is open", what[commit])}
	case e == nil:
		if err := p.refuse(true); err != nil {
			p.mu.Unlock()
			return fmt.Errorf("%s transaction: %w", what[commit], err)
		}
		e = &ending{commit: commit, done: make(chan struct{})}
		p.end = e
		p.ends.Go(func() { p.finish(e) })
	}
	p.mu.Unlock()
	select {
	case <-e.done:
	case <-ctx.Done():
		return &driver.TxnError{Err: fmt.Errorf("%s transaction: %w (it goes on; call again to wait for it)", what[commit], ctx.Err()), Retriable: true}
	}
	p.mu.Lock()
	if p.end == e {
		p.end = nil
	}
	p.mu.Unlock()
	return e.err
}

// closed reports whether ch is closed, without waiting.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// finish ends the transaction for e, and records the outcome.
func (p *producer) finish(e *ending) {
	// The broker aborts a transaction older than its timeout, so waiting longer is pointless.
	ctx, cancel := context.WithTimeout(p.ctx, p.txnTimeout)
	defer cancel()
	var err error
	if e.commit {
		err = p.commit(ctx)
	} else {
		err = p.abort(ctx)
	}
	p.mu.Lock()
	var txnErr *driver.TxnError
	switch {
	case err == nil:
		p.inTxn, p.produced, p.failure = false, 0, nil
	case errors.As(err, &txnErr) && txnErr.Fatal && p.fatal == nil:
		p.fatal = txnErr.Err
	}
	e.err = err
	p.mu.Unlock()
	close(e.done)
}

func (p *producer) commit(ctx context.Context) error {
	if err := p.cl.Flush(ctx); err != nil {
		return &driver.TxnError{Err: fmt.Errorf("commit transaction: flush: %w", err), Retriable: true}
	}
	p.mu.Lock()
	failure := p.failure
	p.mu.Unlock()
	if failure != nil {
		err := fmt.Errorf("commit transaction: a message failed, so the transaction must abort: %w", failure)
		return &driver.TxnError{Err: err, Abortable: !fatal(failure), Fatal: fatal(failure)}
	}
	if err := p.cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
		return &driver.TxnError{Err: fmt.Errorf("commit transaction: %w", err), Abortable: !fatal(err), Fatal: fatal(err)}
	}
	return nil
}

func (p *producer) abort(ctx context.Context) error {
	if err := p.cl.AbortBufferedRecords(ctx); err != nil {
		return &driver.TxnError{Err: fmt.Errorf("abort transaction: fail queued messages: %w", err), Retriable: true}
	}
	if err := p.cl.EndTransaction(ctx, kgo.TryAbort); err != nil {
		// kgo heals an abort whose outcome is unknown on the next try (see EndTransaction).
		return &driver.TxnError{Err: fmt.Errorf("abort transaction: %w", err), Retriable: !fatal(err), Fatal: fatal(err)}
	}
	p.mu.Lock()
	asked := !p.kip890p2 && p.offsetsAsked
	p.mu.Unlock()
	if asked {
		if err := p.abortNotes(ctx); err != nil {
			return &driver.TxnError{Err: fmt.Errorf("abort transaction: %w", err), Retriable: !fatal(err), Fatal: fatal(err)}
		}
	}
	return nil
}

// fatal reports whether err leaves the producer unusable: fenced by a newer producer of its
// transactional ID, or refused for good. Under KIP-890 part 2, kgo recovers from none of these.
// Under the first protocol kgo would re-register after INVALID_PRODUCER_EPOCH (KIP-588: the
// coordinator bumped the epoch to abort a transaction that outlived its timeout); the producer
// takes it as fatal all the same: the epoch ends, and the next one registers a new producer.
func fatal(err error) bool {
	for _, code := range []error{kerr.ProducerFenced, kerr.InvalidProducerEpoch, kerr.InvalidProducerIDMapping,
		kerr.TransactionalIDAuthorizationFailed, kerr.ClusterAuthorizationFailed, kerr.InvalidTxnState,
		kerr.UnsupportedVersion, kerr.UnsupportedForMessageFormat} {
		if errors.Is(err, code) {
			return true
		}
	}
	return errors.Is(err, kgo.ErrClientClosed)
}

// Abandon fails every message kgo holds at once, in flight or not (kgo's
// UnsafeAbortBufferedRecords): the producer is about to close, so the sequence numbers this may
// leave wrong are never used again.
func (p *producer) Abandon() { p.cl.UnsafeAbortBufferedRecords() }

// Close stops the endings and lookups under way, closes the client (which fails whatever it still holds,
// reporting each), waits for every message to be reported, and then lets forward close
// Deliveries once it has handed on the last report.
func (p *producer) Close() {
	p.stop()
	// Right after stop, as the lookups stopped waiting on ctx before: a lookup that asked again
	// with ctx cancelled would find no answer and take the topic for usable.
	p.topics.Close()
	p.ends.Wait()
	p.cl.Close()
	p.mu.Lock()
	notes := p.notes
	p.mu.Unlock()
	if notes != nil {
		notes.Close()
	}
	p.mu.Lock()
	for p.queued > 0 {
		p.idle.Wait()
	}
	p.mu.Unlock()
	p.reports.Close()
}

var _ driver.KafkaProducer = (*producer)(nil)
