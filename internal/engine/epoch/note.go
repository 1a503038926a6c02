package epoch

import (
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"

	"github.com/goharvest/goharvest/driver"
)

// A transaction may carry several records of one key (a run), so that a few busy keys do not
// hold the throughput to one record per key per transaction. That is safe while the pipeline
// lives: a run commits or aborts as a whole, and an aborted run is sent again from its first
// record. The danger is a leader that stops after a run commits and before its purge does: its
// successor would publish the whole run again, and a consumer would see A B A B, a key going
// backwards. Publishing just the run's last record again is harmless (A B B).
//
// So a transaction that carries runs also writes a note (KafkaProducer.WriteNote), committed
// atomically with its messages, that lists every record of each run but the last, together with
// any records earlier notes listed that are not purged yet. A new epoch reads the latest note
// after its InitTransactions has settled every earlier transaction, and purges the records it
// lists before it marks anything. What it then publishes again is at most the last record of each
// run: an immediate repeat, as with a single record in flight.

// A note lists each record by id and by a fingerprint of its row (Fingerprint), and the new
// epoch purges a noted row only if it still has that fingerprint. After a failover to an
// asynchronous standby that lacked the old primary's last inserts, the promoted database hands
// their ids out again, to new rows; a purge by id alone would delete such a row unpublished.

// notePrefix starts every note, naming its format: 2 lists ids and fingerprints. Format 1,
// written by earlier releases, lists ids alone; such a note is still read, and its records are
// purged by id, as those releases did.
const (
	notePrefix   = "goharvest/2:"
	notePrefixV1 = "goharvest/1:"
)

// MaxNotedRecords bounds the records one note lists. Each takes at most 10 bytes of id and 4 of
// fingerprint before base64, so a full note stays below the 4,096 bytes Kafka allows offset
// metadata by default (offset.metadata.max.bytes).
const MaxNotedRecords = 200

// Noted is a record a note lists.
type Noted struct {
	ID          int64
	Fingerprint uint32
	// Fingerprinted is false for the records of a format 1 note, which has no fingerprints.
	Fingerprinted bool
}

// Fingerprint hashes what tells a row from another that took the same id: when it was written and
// what it publishes. Each field is written with its length, so that no two records share an
// encoding.
func Fingerprint(rec driver.OutboxRecord) uint32 {
	h := fnv.New32a()
	var buf []byte
	field := func(s string) {
		buf = binary.AppendUvarint(buf, uint64(len(s)))
		buf = append(buf, s...)
	}
	buf = binary.AppendVarint(buf, rec.CreateTime.UnixMicro())
	field(rec.KafkaTopic)
	field(rec.KafkaKey)
	if rec.KafkaValue == nil {
		buf = append(buf, 0)
	} else {
		buf = append(buf, 1)
		field(*rec.KafkaValue)
	}
	buf = binary.AppendUvarint(buf, uint64(len(rec.KafkaHeaders)))
	for _, hd := range rec.KafkaHeaders {
		field(hd.Key)
		field(hd.Value)
	}
	h.Write(buf)
	return h.Sum32()
}

// EncodeNote writes records (in any order) as a note: sorted by id, each as the varint delta of
// its id and its fingerprint, in base64.
func EncodeNote(records []Noted) string {
	sorted := slices.Clone(records)
	slices.SortFunc(sorted, func(a, b Noted) int { return cmp.Compare(a.ID, b.ID) })
	sorted = slices.CompactFunc(sorted, func(a, b Noted) bool { return a.ID == b.ID })
	buf := make([]byte, 0, len(sorted)*6)
	var prev int64
	for _, r := range sorted {
		buf = binary.AppendUvarint(buf, uint64(r.ID-prev))
		buf = binary.BigEndian.AppendUint32(buf, r.Fingerprint)
		prev = r.ID
	}
	return notePrefix + base64.RawURLEncoding.EncodeToString(buf)
}

// DecodeNote reads the records a note lists; "" lists none.
func DecodeNote(note string) ([]Noted, error) {
	if note == "" {
		return nil, nil
	}
	body, fingerprinted := strings.CutPrefix(note, notePrefix)
	if !fingerprinted {
		var ok bool
		if body, ok = strings.CutPrefix(note, notePrefixV1); !ok {
			return nil, fmt.Errorf("note %.40q: unknown format", note)
		}
	}
	buf, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return nil, fmt.Errorf("note: %w", err)
	}
	var records []Noted
	var id int64
	for len(buf) > 0 {
		delta, n := binary.Uvarint(buf)
		if n <= 0 {
			return nil, errors.New("note: truncated record id")
		}
		id += int64(delta)
		buf = buf[n:]
		r := Noted{ID: id}
		if fingerprinted {
			if len(buf) < 4 {
				return nil, errors.New("note: truncated fingerprint")
			}
			r.Fingerprint, r.Fingerprinted = binary.BigEndian.Uint32(buf), true
			buf = buf[4:]
		}
		records = append(records, r)
	}
	return records, nil
}

// ledger holds the records that committed notes list and that are not purged yet; each new note
// lists them again, since it replaces the one before. noted counts those and the records the
// current transaction's note will list, and stays within MaxNotedRecords. Both are guarded by mu.
type ledger struct {
	mu    sync.Mutex
	ids   map[int64]uint32 // id -> fingerprint
	noted int
}

// reserve counts one more record for the current transaction's note, if the note has room.
func (l *ledger) reserve() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.noted >= MaxNotedRecords {
		return false
	}
	l.noted++
	return true
}

// unreserve takes back n records that the current transaction's note will not list after all.
func (l *ledger) unreserve(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.noted -= n
}

func (l *ledger) add(fs []*flight) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ids == nil {
		l.ids = map[int64]uint32{}
	}
	for _, f := range fs {
		l.ids[f.rec.ID] = Fingerprint(f.rec.OutboxRecord)
	}
}

// forget drops the noted records among fs (now purged), making room in the note.
func (l *ledger) forget(fs []*flight) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range fs {
		if f.noted {
			delete(l.ids, f.rec.ID)
			l.noted--
		}
	}
}

// note returns the note for a transaction that carries the runs' records extra.
func (l *ledger) note(extra []*flight) string {
	l.mu.Lock()
	records := make([]Noted, 0, len(l.ids)+len(extra))
	for id, fp := range l.ids {
		records = append(records, Noted{ID: id, Fingerprint: fp})
	}
	l.mu.Unlock()
	for _, f := range extra {
		records = append(records, Noted{ID: f.rec.ID, Fingerprint: Fingerprint(f.rec.OutboxRecord)})
	}
	return EncodeNote(records)
}
