package memory

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/outbox"
)

var _ driver.KafkaProducer = (*Producer)(nil)

// Broker is an in-memory Kafka cluster as goharvest's producers see it: transactions whose
// messages a read_committed consumer sees once they commit (Committed), notes kept with the
// transactions that write them, and fencing by transactional ID. Producers deliver
// asynchronously, after the broker's latency. The zero value is not usable; NewBroker makes one.
type Broker struct {
	mu        sync.Mutex
	latency   time.Duration
	refuse    func(msg driver.Message) error
	epochs    map[string]int // transactional ID -> its newest producer's epoch
	notes     map[driver.NotePlace]string
	committed []Message
	producers int // producers made so far
}

// Message is a message as a read_committed consumer receives it from a Broker.
type Message struct {
	Topic   string
	Key     []byte
	Value   []byte // nil for a tombstone
	Headers outbox.Headers
	// Opaque is what the producer was given with the message (driver.Message.Opaque).
	Opaque any
	// Producer numbers the producer that published it: 1 for the broker's first, and so on.
	Producer int
}

// NewBroker returns a broker with no messages, no notes and no latency.
func NewBroker() *Broker {
	return &Broker{epochs: map[string]int{}, notes: map[driver.NotePlace]string{}}
}

// SetLatency sets how long each message takes to be reported delivered, from Produce; zero
// reports it at once (from another goroutine).
func (b *Broker) SetLatency(d time.Duration) {
	b.mu.Lock()
	b.latency = d
	b.mu.Unlock()
}

// SetRefuse sets a test hook called with each message Produce accepts, under the broker's lock
// (it must not call the broker). A nil return lets the message through. An error is the
// message's delivery error, as Kafka's refusal arriving after the request: a *driver.RejectedError
// for a refusal of the message as it stands (too large, say), anything else for a failure worth
// retrying; as with librdkafka, the transaction must then be aborted (Produce refuses new
// messages and CommitTransaction fails abortably). A nil refuse lets every message through.
func (b *Broker) SetRefuse(refuse func(msg driver.Message) error) {
	b.mu.Lock()
	b.refuse = refuse
	b.mu.Unlock()
}

// Committed returns every committed message, in the order of their transactions' commits and,
// within one, of Produce.
func (b *Broker) Committed() []Message {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.committed)
}

// Note returns the latest committed note at place, "" if none.
func (b *Broker) Note(place driver.NotePlace) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.notes[place]
}

// SetNote leaves note at place, as a committed transaction of an earlier harvester would have.
// Test hook.
func (b *Broker) SetNote(place driver.NotePlace, note string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.notes[place] = note
}

// NewProducer returns a producer of transactional ID txnID, before InitTransactions.
func (b *Broker) NewProducer(txnID string) *Producer {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.producers++
	return &Producer{b: b, txnID: txnID, n: b.producers, deliveries: make(chan driver.Delivery, deliveriesBuffer)}
}

// deliveriesBuffer is the room for delivery reports not yet received: enough that reports wait
// for no reader in any test.
const deliveriesBuffer = 100_000

// Producer is a transactional producer of a Broker. Like librdkafka's, it refuses new messages
// while its transaction must be aborted, and once fenced or closed fails every call with a fatal
// TxnError.
type Producer struct {
	b          *Broker
	txnID      string
	n          int
	deliveries chan driver.Delivery
	pending    sync.WaitGroup // deliveries not yet reported

	// Guarded by b.mu:
	epoch     int // of InitTransactions; 0 before
	txn       []pendingMessage
	note      *string
	notePlace driver.NotePlace
	abortable bool // a message of the transaction failed
	fatal     bool // fenced
	closed    bool
}

type pendingMessage struct {
	msg driver.Message
	err error
}

// ErrFenced is the error of a fatal TxnError from a producer that a newer one of its
// transactional ID has fenced.
var ErrFenced = errors.New("producer fenced by a newer producer of its transactional ID")

// errClosed is the error of a fatal TxnError from a closed producer.
var errClosed = errors.New("producer closed")

// errState is what Produce returns while the transaction must be aborted, in librdkafka's
// words, so that logs read the same with either producer.
var errState = errors.New("Local: Erroneous state")

func fatal(err error) error { return &driver.TxnError{Err: err, Fatal: true} }

// live reports why the producer cannot be used, if it cannot: it was closed, or fenced by a
// newer producer's InitTransactions. Called with b.mu held.
func (p *Producer) live() error {
	if p.closed {
		return fatal(errClosed)
	}
	if p.fatal || p.epoch != 0 && p.epoch != p.b.epochs[p.txnID] {
		p.fatal = true
		return fatal(ErrFenced)
	}
	return nil
}

// InitTransactions implements driver.KafkaProducer: it fences every earlier producer of the
// transactional ID, whose open transaction is then never committed.
func (p *Producer) InitTransactions(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return &driver.TxnError{Err: err, Retriable: true}
	}
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if err := p.live(); err != nil {
		return err
	}
	p.b.epochs[p.txnID]++
	p.epoch = p.b.epochs[p.txnID]
	return nil
}

// BeginTransaction implements driver.KafkaProducer.
func (p *Producer) BeginTransaction() error {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	return p.live()
}

// Produce implements driver.KafkaProducer.
func (p *Producer) Produce(msg driver.Message) error {
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := p.live(); err != nil {
		return err
	}
	if err := outbox.CheckName(msg.Topic); err != nil {
		return &driver.RejectedError{Err: err, ByGoharvest: true}
	}
	if p.abortable {
		return &driver.TxnError{Err: errState, Retriable: true}
	}
	msg.Key, msg.Value, msg.Headers = slices.Clone(msg.Key), cloneValue(msg.Value), slices.Clone(msg.Headers)
	var err error
	if b.refuse != nil {
		err = b.refuse(msg)
	}
	p.txn = append(p.txn, pendingMessage{msg: msg, err: err})
	p.abortable = p.abortable || err != nil
	latency := b.latency
	p.pending.Go(func() {
		time.Sleep(latency) // the broker's latency
		p.deliveries <- driver.Delivery{Opaque: msg.Opaque, Err: err}
	})
	return nil
}

// cloneValue copies v, keeping nil (a tombstone) apart from empty.
func cloneValue(v []byte) []byte {
	if v == nil {
		return nil
	}
	return append([]byte{}, v...)
}

// WriteNote implements driver.KafkaProducer.
func (p *Producer) WriteNote(_ context.Context, place driver.NotePlace, note string) error {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if err := p.live(); err != nil {
		return err
	}
	p.note, p.notePlace = &note, place
	return nil
}

// ReadNote implements driver.KafkaProducer.
func (p *Producer) ReadNote(_ context.Context, place driver.NotePlace) (string, error) {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	return p.b.notes[place], nil
}

// CommitTransaction implements driver.KafkaProducer: it waits for every message's delivery
// report, as a flush does, then publishes the transaction's messages and its note.
func (p *Producer) CommitTransaction(context.Context) error {
	p.pending.Wait()
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := p.live(); err != nil {
		return err
	}
	for _, m := range p.txn {
		if m.err != nil {
			return &driver.TxnError{Err: errors.Join(errors.New("a message of the transaction failed"), m.err), Abortable: true}
		}
	}
	for _, m := range p.txn {
		b.committed = append(b.committed, Message{Topic: m.msg.Topic, Key: m.msg.Key, Value: m.msg.Value,
			Headers: m.msg.Headers, Opaque: m.msg.Opaque, Producer: p.n})
	}
	if p.note != nil {
		b.notes[p.notePlace] = *p.note
	}
	p.endTxn()
	return nil
}

// AbortTransaction implements driver.KafkaProducer.
func (p *Producer) AbortTransaction(context.Context) error {
	p.pending.Wait()
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if err := p.live(); err != nil {
		return err
	}
	p.endTxn()
	return nil
}

// endTxn forgets the current transaction. Called with b.mu held.
func (p *Producer) endTxn() {
	p.txn, p.note, p.abortable = nil, nil, false
}

// Deliveries implements driver.KafkaProducer.
func (p *Producer) Deliveries() <-chan driver.Delivery { return p.deliveries }

// Abandon implements driver.KafkaProducer; the broker reports every message soon anyway.
func (p *Producer) Abandon() {}

// Close implements driver.KafkaProducer. A transaction left open is never committed; the next
// producer of the transactional ID would have aborted it.
func (p *Producer) Close() {
	p.pending.Wait()
	p.b.mu.Lock()
	closed := p.closed
	p.endTxn()
	p.closed = true
	p.b.mu.Unlock()
	if !closed {
		close(p.deliveries)
	}
}
