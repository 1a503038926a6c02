package franz

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest/driver"
)

// A transaction's note is an offset commit in the note group, written inside the transaction
// (TxnOffsetCommit), so that it is read back only once the transaction commits.

// WriteNote sends a TxnOffsetCommit for place with the producer's ID and epoch, by hand: kgo
// commits offsets in a transaction only for a group it consumes as a member, and the notes group
// has no members. The note must commit or abort with the transaction, so its group is in the
// transaction first: under KIP-890 part 2 (kip890p2) TxnOffsetCommit v5 adds it; under the first
// protocol WriteNote sends AddOffsetsToTxn for the group (once a transaction), and then
// TxnOffsetCommit v4 on the notes client, as the Java client and librdkafka do. kgo's
// EndTransaction ends the transaction because its messages added their partitions. A
// transaction without a message would leave the note pending at the broker, since kgo ends only a
// transaction that produced; so WriteNote refuses one.
//
// The note is the metadata of offset 0 of the partition, as the librdkafka driver writes it, so
// that either driver reads the other's notes.
func (p *producer) WriteNote(ctx context.Context, place driver.NotePlace, note string) error {
	p.mu.Lock()
	err := p.refuse(true)
	if err == nil && p.produced == 0 {
		err = &driver.TxnError{Err: errors.New("a note needs a message in its transaction")}
	}
	kip890p2, notes, added := p.kip890p2, p.notes, p.offsetsAdded[place.Group]
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("write note: %w", err)
	}
	id, epoch, err := p.cl.ProducerID(ctx)
	if err != nil {
		return &driver.TxnError{Err: fmt.Errorf("write note: producer ID: %w", err), Abortable: !fatal(err), Fatal: fatal(err)}
	}
	topicID, err := p.topicID(ctx, place.Topic)
	if err != nil {
		return &driver.TxnError{Err: fmt.Errorf("write note to group %q: %w", place.Group, err), Abortable: true}
	}
	req := kmsg.NewPtrTxnOffsetCommitRequest()
	req.TransactionalID = p.txnID
	req.Group = place.Group
	req.ProducerID, req.ProducerEpoch = id, epoch
	// Generation -1 and no member ID: a group without members accepts offsets from a producer
	// that is none of its consumers.
	req.Generation, req.MemberID = -1, ""
	topic := kmsg.NewTxnOffsetCommitRequestTopic()
	// Both name and ID, so that the request reads right at any version the broker picks
	// (v6 names topics by ID).
	topic.Topic, topic.TopicID = place.Topic, topicID
	part := kmsg.NewTxnOffsetCommitRequestTopicPartition()
	part.Partition, part.Offset, part.Metadata = place.Partition, 0, &note
	topic.Partitions = append(topic.Partitions, part)
	req.Topics = append(req.Topics, topic)

	cl := p.cl
	if !kip890p2 {
		cl = notes // TxnOffsetCommit v4 at most
		if !added {
			p.mu.Lock()
			p.offsetsAsked = true
			p.mu.Unlock()
			err = retryConcurrent(ctx, func() error { return p.addOffsets(ctx, id, epoch, place.Group) })
			if err == nil {
				p.mu.Lock()
				if p.offsetsAdded == nil {
					p.offsetsAdded = map[string]bool{}
				}
				p.offsetsAdded[place.Group] = true
				p.mu.Unlock()
			}
		}
	}
	if err == nil {
		err = retryConcurrent(ctx, func() error {
			resp, err := req.RequestWith(ctx, cl)
			if err != nil {
				return err
			}
			for _, t := range resp.Topics {
				for _, pt := range t.Partitions {
					if err := kerr.ErrorForCode(pt.ErrorCode); err != nil {
						return err
					}
				}
			}
			return nil
		})
	}
	switch {
	case err == nil:
		return nil
	case errors.Is(err, kerr.GroupAuthorizationFailed):
		err = fmt.Errorf("this client may not write the notes of group %q: grant READ on group %s: %w", place.Group, place.Group, err)
	default:
		err = fmt.Errorf("write note to group %q: %w", place.Group, err)
	}
	return &driver.TxnError{Err: err, Abortable: !fatal(err), Fatal: fatal(err)}
}

// addOffsets sends AddOffsetsToTxn for group with the producer's ID and epoch: under the first
// transaction protocol, the group's offsets partition joins the transaction, so that its
// TxnOffsetCommit commits or aborts with it.
func (p *producer) addOffsets(ctx context.Context, id int64, epoch int16, group string) error {
	req := kmsg.NewPtrAddOffsetsToTxnRequest()
	req.TransactionalID = p.txnID
	req.ProducerID, req.ProducerEpoch = id, epoch
	req.Group = group
	resp, err := req.RequestWith(ctx, p.cl)
	if err != nil {
		return fmt.Errorf("add the group to the transaction: %w", err)
	}
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return fmt.Errorf("add the group to the transaction: %w", err)
	}
	return nil
}

// concurrentBackoff is how long WriteNote waits before asking again while the transaction
// coordinator answers CONCURRENT_TRANSACTIONS: it is still writing the previous transaction's
// markers, which takes milliseconds. At kgo's ConcurrentTransactionsBackoff default, 20ms, the
// wait was most of a note's time (p50 23ms on Kafka 4.4, against 7ms at this). Only the note's
// own requests wait this little; kgo's keep its default (see Config.Opts).
const concurrentBackoff = 2 * time.Millisecond

// retryConcurrent calls f until it returns something other than CONCURRENT_TRANSACTIONS, or ctx
// ends.
func retryConcurrent(ctx context.Context, f func() error) error {
	for {
		err := f()
		if !errors.Is(err, kerr.ConcurrentTransactions) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(concurrentBackoff):
		}
	}
}

// topicID returns the ID of topic, from kgo's cached metadata.
func (p *producer) topicID(ctx context.Context, topic string) ([16]byte, error) {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := p.cl.RequestCachedMetadata(ctx, req, 0)
	if err != nil {
		return [16]byte{}, fmt.Errorf("metadata of topic %q: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if t.Topic != nil && *t.Topic == topic {
			if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
				return [16]byte{}, fmt.Errorf("metadata of topic %q: %w", topic, err)
			}
			return t.TopicID, nil
		}
	}
	return [16]byte{}, fmt.Errorf("metadata of topic %q: not in the answer", topic)
}

// unstableBackoff is how long ReadNote waits before asking again while the group has offsets of
// a transaction not yet ended.
const unstableBackoff = 50 * time.Millisecond

// ReadNote fetches the committed offset of place with RequireStable (KIP-447): while a
// transaction that wrote offsets to the group is still ending, the broker answers
// UNSTABLE_OFFSET_COMMIT, and ReadNote asks again, so that it sees the outcome of every
// transaction InitTransactions settled.
func (p *producer) ReadNote(ctx context.Context, place driver.NotePlace) (string, error) {
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = place.Group
	req.RequireStable = true
	topic := kmsg.NewOffsetFetchRequestTopic()
	topic.Topic = place.Topic
	topic.Partitions = []int32{place.Partition}
	req.Topics = append(req.Topics, topic)
	for {
		resp, err := req.RequestWith(ctx, p.cl)
		var note string
		if err == nil {
			note, err = noteOf(resp, place)
		}
		switch {
		case err == nil:
			return note, nil
		case errors.Is(err, kerr.GroupIDNotFound):
			return "", nil // no transaction has written a note yet
		case !errors.Is(err, kerr.UnstableOffsetCommit):
			return "", noteError(place, err)
		}
		select {
		case <-ctx.Done():
			return "", noteError(place, err)
		case <-time.After(unstableBackoff):
		}
	}
}

// noteOf returns the note of place in resp: the metadata of a committed offset, or "" if none is.
func noteOf(resp *kmsg.OffsetFetchResponse, place driver.NotePlace) (string, error) {
	code, topics := resp.ErrorCode, resp.Topics
	if len(resp.Groups) > 0 {
		// kgo sends one group per request as a group of the batched form (v8+), and may answer in it.
		g := resp.Groups[0]
		if err := kerr.ErrorForCode(g.ErrorCode); err != nil {
			return "", err
		}
		for _, t := range g.Topics {
			for _, pt := range t.Partitions {
				if pt.Partition != place.Partition {
					continue
				}
				if err := kerr.ErrorForCode(pt.ErrorCode); err != nil {
					return "", err
				}
				if pt.Offset >= 0 && pt.Metadata != nil {
					return *pt.Metadata, nil
				}
			}
		}
		return "", nil
	}
	if err := kerr.ErrorForCode(code); err != nil {
		return "", err
	}
	for _, t := range topics {
		for _, pt := range t.Partitions {
			if pt.Partition != place.Partition {
				continue
			}
			if err := kerr.ErrorForCode(pt.ErrorCode); err != nil {
				return "", err
			}
			if pt.Offset >= 0 && pt.Metadata != nil {
				return *pt.Metadata, nil
			}
		}
	}
	return "", nil
}

// noteError wraps a failure to read a note. A refusal for lack of permission is a
// KafkaConfigError, with the ACL that would allow it: retrying cannot help, and a leader that
// cannot read its shard's note must not publish it.
func noteError(place driver.NotePlace, err error) error {
	switch {
	case errors.Is(err, kerr.GroupAuthorizationFailed):
		return &driver.KafkaConfigError{Err: fmt.Errorf("this client may not read the notes of group %q: grant READ on group %s: %w",
			place.Group, place.Group, err)}
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		return &driver.KafkaConfigError{Err: fmt.Errorf("this client may not read the notes of group %q on topic %q: grant READ on topic %s: %w",
			place.Group, place.Topic, place.Topic, err)}
	}
	return fmt.Errorf("read note from group %q: %w", place.Group, err)
}

// abortNotes ends, under the first protocol, a transaction that WriteNote may have added a group
// to, in case kgo did not: kgo sends EndTxn only when AddPartitionsToTxn added a partition, so a
// transaction whose every message failed before that would stay open at the broker with its
// note, and the next transaction, of the same producer epoch, would commit it. Sent again after
// kgo's EndTxn, the abort is answered as a retry (NONE), or CONCURRENT_TRANSACTIONS while the
// markers are written; INVALID_TXN_STATE says no transaction is open (AddOffsetsToTxn never
// reached the broker), which is what abortNotes wants.
func (p *producer) abortNotes(ctx context.Context) error {
	id, epoch, err := p.cl.ProducerID(ctx)
	if err != nil {
		return fmt.Errorf("producer ID: %w", err)
	}
	p.mu.Lock()
	notes := p.notes
	p.mu.Unlock()
	req := kmsg.NewPtrEndTxnRequest()
	req.TransactionalID = p.txnID
	req.ProducerID, req.ProducerEpoch = id, epoch
	req.Commit = false
	err = retryConcurrent(ctx, func() error {
		resp, err := req.RequestWith(ctx, notes) // EndTxn v4 at most, as TxnOffsetCommit
		if err != nil {
			return err
		}
		return kerr.ErrorForCode(resp.ErrorCode)
	})
	if err != nil && !errors.Is(err, kerr.InvalidTxnState) {
		return fmt.Errorf("end the notes' transaction: %w", err)
	}
	p.mu.Lock()
	clear(p.offsetsAdded)
	p.offsetsAsked = false
	p.mu.Unlock()
	return nil
}
