package epoch

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
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

// notePrefix starts every note, naming its format.
const notePrefix = "goharvest/1:"

// MaxNotedRecords bounds the records one note lists. Each takes at most 10 bytes before base64,
// so a full note stays below the 4,096 bytes Kafka allows offset metadata by default
// (offset.metadata.max.bytes).
const MaxNotedRecords = 280

// EncodeNote writes ids (in any order) as a note: sorted, as varint deltas, in base64.
func EncodeNote(ids []int64) string {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	buf := make([]byte, 0, len(sorted)*2)
	var prev int64
	for _, id := range slices.Compact(sorted) {
		buf = binary.AppendUvarint(buf, uint64(id-prev))
		prev = id
	}
	return notePrefix + base64.RawURLEncoding.EncodeToString(buf)
}

// DecodeNote reads the ids a note lists; "" lists none.
func DecodeNote(note string) ([]int64, error) {
	if note == "" {
		return nil, nil
	}
	body, ok := strings.CutPrefix(note, notePrefix)
	if !ok {
		return nil, fmt.Errorf("note %.40q: unknown format", note)
	}
	buf, err := base64.RawURLEncoding.DecodeString(body)
	if err != nil {
		return nil, fmt.Errorf("note: %w", err)
	}
	var ids []int64
	var id int64
	for len(buf) > 0 {
		delta, n := binary.Uvarint(buf)
		if n <= 0 {
			return nil, errors.New("note: truncated record id")
		}
		id += int64(delta)
		ids = append(ids, id)
		buf = buf[n:]
	}
	return ids, nil
}

// ledger holds the records that committed notes list and that are not purged yet; each new note
// lists them again, since it replaces the one before. noted counts those and the records the
// current transaction's note will list, and stays within MaxNotedRecords. Both are guarded by mu.
type ledger struct {
	mu    sync.Mutex
	ids   map[int64]struct{}
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
		l.ids = map[int64]struct{}{}
	}
	for _, f := range fs {
		l.ids[f.rec.ID] = struct{}{}
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
	ids := make([]int64, 0, len(l.ids)+len(extra))
	for id := range l.ids {
		ids = append(ids, id)
	}
	l.mu.Unlock()
	for _, f := range extra {
		ids = append(ids, f.rec.ID)
	}
	return EncodeNote(ids)
}
