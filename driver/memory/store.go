package memory

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/goharvest/goharvest/driver"
)

var (
	_ driver.Store  = (*Store)(nil)
	_ driver.Reader = (*Store)(nil)
	_ driver.Pinger = (*Store)(nil)
)

// Store is an in-memory outbox with the semantics of the Postgres binding: ids are assigned in
// insertion order, a mark stamps a leader ID, every row has a version that changes with its
// content, and dead letters leave the outbox. Every method may be called from several goroutines
// at once. The zero value is not usable; NewStore makes one.
type Store struct {
	mu          sync.Mutex
	rows        map[int64]*row
	nextID      int64 // the last id assigned
	nextVersion int64 // the last version assigned
	deadLetters map[int64]driver.DeadLetterInfo
}

// row is one row of the outbox.
type row struct {
	rec       driver.OutboxRecord
	version   int64
	malformed string // why the row cannot become a message; "" when it can
}

// NewStore returns an empty outbox.
func NewStore() *Store {
	return &Store{rows: map[int64]*row{}, deadLetters: map[int64]driver.DeadLetterInfo{}}
}

// Insert adds records in order, as writers' transactions committing one after another would, and
// returns their ids. A record's ID and LeaderID are ignored; a zero CreateTime becomes the
// current time. Creation times are kept to the microsecond, as Postgres keeps them.
func (s *Store) Insert(recs ...driver.OutboxRecord) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]int64, 0, len(recs))
	for _, r := range recs {
		s.nextID++
		s.put(s.nextID, r)
		ids = append(ids, s.nextID)
	}
	return ids
}

// InsertAt adds a record with the given id, as a writer's transaction that took a lower id and
// committed late would (see SkipIDs). An existing row of that id is replaced.
func (s *Store) InsertAt(id int64, r driver.OutboxRecord) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.put(id, r)
	s.nextID = max(s.nextID, id)
}

// SkipIDs passes over n ids, as writers' transactions that took them and have not committed
// would; InsertAt writes them later.
func (s *Store) SkipIDs(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextID += int64(n)
}

// put stores r under id with a new version. Called with s.mu held.
func (s *Store) put(id int64, r driver.OutboxRecord) {
	r.ID, r.LeaderID = id, nil
	if r.CreateTime.IsZero() {
		r.CreateTime = time.Now()
	}
	r.CreateTime = r.CreateTime.Truncate(time.Microsecond)
	r.KafkaHeaders = slices.Clone(r.KafkaHeaders)
	s.nextVersion++
	s.rows[id] = &row{rec: r, version: s.nextVersion}
}

// Update changes a row as an operator's UPDATE would, giving it a new version, and reports
// whether the row exists. Test hook: the engine never updates rows but by marking them.
func (s *Store) Update(id int64, change func(r *driver.OutboxRecord)) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rows[id]
	if r == nil {
		return false
	}
	change(&r.rec)
	r.rec.ID = id
	s.nextVersion++
	r.version = s.nextVersion
	return true
}

// SetMalformed makes the row come back from Mark, Read and Reread with a *driver.RecordError
// giving reason, as a row whose header arrays differ in length does from Postgres; an empty
// reason makes it well-formed again (an operator's fix, which also gives it a new version).
// Test hook.
func (s *Store) SetMalformed(id int64, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.rows[id]; r != nil {
		r.malformed = reason
		s.nextVersion++
		r.version = s.nextVersion
	}
}

// Delete deletes a row, as an operator would.
func (s *Store) Delete(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.rows, id)
}

// Exists reports whether the row is in the outbox.
func (s *Store) Exists(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rows[id] != nil
}

// Row returns the row with the given id as it stands, if it exists.
func (s *Store) Row(id int64) (driver.OutboxRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.rows[id]; r != nil {
		return r.out().OutboxRecord, true
	}
	return driver.OutboxRecord{}, false
}

// Len returns how many rows the outbox holds.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.rows)
}

// DeadLetters returns what DeadLetter recorded of each row it moved, by id.
func (s *Store) DeadLetters() map[int64]driver.DeadLetterInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.deadLetters)
}

// out returns the row as a claim returns it: a copy, with its error if it is malformed.
func (r *row) out() driver.MarkedRecord {
	m := driver.MarkedRecord{OutboxRecord: r.rec}
	m.KafkaHeaders = slices.Clone(r.rec.KafkaHeaders)
	if r.rec.LeaderID != nil {
		l := *r.rec.LeaderID
		m.LeaderID = &l
	}
	if r.rec.KafkaValue != nil {
		v := *r.rec.KafkaValue
		m.KafkaValue = &v
	}
	if r.malformed != "" {
		m.Err = &driver.RecordError{ID: r.rec.ID, Reason: r.malformed}
	}
	return m
}

// Mark implements driver.DatabaseBinding.
func (s *Store) Mark(ctx context.Context, leaderID uuid.UUID, limit int) ([]driver.MarkedRecord, error) {
	return s.MarkExcept(ctx, leaderID, limit, nil)
}

// MarkExcept implements driver.HeldRowBinding.
func (s *Store) MarkExcept(ctx context.Context, leaderID uuid.UUID, limit int, heldKeys []string) ([]driver.MarkedRecord, error) {
	return s.claim(ctx, limit, func(r *row) bool {
		return (r.rec.LeaderID == nil || *r.rec.LeaderID != leaderID) && !slices.Contains(heldKeys, r.rec.KafkaKey)
	}, func(r *row) {
		l := leaderID
		r.rec.LeaderID = &l
	})
}

// Read implements driver.Reader: what MarkExcept would return, changing nothing.
func (s *Store) Read(ctx context.Context, limit int, heldKeys []string, exclude []int64) ([]driver.MarkedRecord, error) {
	return s.claim(ctx, limit, func(r *row) bool {
		return !slices.Contains(exclude, r.rec.ID) && !slices.Contains(heldKeys, r.rec.KafkaKey)
	}, func(*row) {})
}

// claim returns up to limit of the oldest rows that pick; claimed changes each row returned (a
// mark's stamp) before it is copied.
func (s *Store) claim(ctx context.Context, limit int, pick func(*row) bool, claimed func(*row)) ([]driver.MarkedRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []int64
	for id, r := range s.rows {
		if pick(r) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var out []driver.MarkedRecord
	for _, id := range ids[:min(max(limit, 0), len(ids))] {
		r := s.rows[id]
		claimed(r)
		out = append(out, r.out())
	}
	return out, nil
}

// Purge implements driver.DatabaseBinding.
func (s *Store) Purge(ctx context.Context, ids []int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		if s.rows[id] != nil {
			delete(s.rows, id)
			n++
		}
	}
	return n, nil
}

// Reset implements driver.DatabaseBinding.
func (s *Store) Reset(ctx context.Context, leaderID uuid.UUID, ids []int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, id := range ids {
		if r := s.rows[id]; r != nil && r.rec.LeaderID != nil && *r.rec.LeaderID == leaderID {
			r.rec.LeaderID = nil
			n++
		}
	}
	return n, nil
}

// Dispose implements driver.DatabaseBinding; the outbox stays usable.
func (s *Store) Dispose() {}

// Reread implements driver.HeldRowBinding.
func (s *Store) Reread(ctx context.Context, ids []int64) ([]driver.RereadRecord, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []driver.RereadRecord
	for _, id := range ids {
		if r := s.rows[id]; r != nil {
			out = append(out, driver.RereadRecord{MarkedRecord: r.out(), Version: strconv.FormatInt(r.version, 10)})
		}
	}
	return out, nil
}

// PurgeUnchanged implements driver.HeldRowBinding.
func (s *Store) PurgeUnchanged(ctx context.Context, versions map[int64]string) ([]int64, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var purged []int64
	for id, v := range versions {
		if r := s.rows[id]; r != nil && strconv.FormatInt(r.version, 10) == v {
			delete(s.rows, id)
			purged = append(purged, id)
		}
	}
	slices.Sort(purged)
	return purged, nil
}

// DeadLetter implements driver.HeldRowBinding; DeadLetters returns what it recorded.
func (s *Store) DeadLetter(ctx context.Context, id int64, version string, info driver.DeadLetterInfo) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rows[id]
	if r == nil || (version != "" && strconv.FormatInt(r.version, 10) != version) {
		return false, nil
	}
	delete(s.rows, id)
	s.deadLetters[id] = info
	return true, nil
}

// Ping implements driver.Pinger: an in-memory outbox is always there.
func (s *Store) Ping(ctx context.Context) error { return ctx.Err() }
