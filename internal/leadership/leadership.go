// Package leadership is the part of Fast NELI (see package neli's doc) that no Kafka client
// decides, written once for both elections, package neli's on librdkafka and driver/franz's on
// kgo. A Contender (contender.go) takes up the group's assignments and revocations, fences a
// leader whose heartbeats go unacknowledged, runs the Barrier, checks the leader topic's size,
// and keeps the heartbeats' books; each election adapts its client to it. Its View (this file) is
// what the contender leads: the partitions the group assigned it, whether it fenced itself, and
// when its newest acknowledged heartbeat was sent. A partition is led only while assigned,
// unfenced, and vouched for by a heartbeat acknowledged within the timeout; a fenced contender
// leads again only through a fresh assignment.
//
// The election's loop changes the view; any goroutine may read it. Reads consult the clock, so a
// leader whose loop stalls reads as fenced once the timeout passes, before the loop notices.
package leadership

import (
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// HeartbeatFanout is how many of its partitions a leader sends a heartbeat to in each round. Any
// one acknowledged is enough; with the partitions' leaders spread over the brokers, three usually
// reach three brokers, so that one broker's loss leaves heartbeats acknowledged.
const HeartbeatFanout = 3

// View is one contender's leadership. The zero value is not usable; see newView.
type View struct {
	timeout time.Duration

	mu            sync.Mutex
	assigned      []int32 // sorted
	fenced        bool
	lastHeartbeat time.Time // when the newest acknowledged heartbeat was sent (monotonic)
	nextBeat      int       // which of the assigned partitions the next round of heartbeats starts at
}

// newView returns an empty view whose leadership lapses heartbeatTimeout after the newest
// acknowledged heartbeat was sent.
func newView(heartbeatTimeout time.Duration) *View { return &View{timeout: heartbeatTimeout} }

// Read returns whether any partition is assigned, and whether the contender leads now.
func (v *View) Read() (holds, leading bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return len(v.assigned) > 0, v.leadingLocked()
}

func (v *View) leadingLocked() bool {
	return len(v.assigned) > 0 && !v.fenced && time.Since(v.lastHeartbeat) < v.timeout
}

// Leading reports whether the contender leads now.
func (v *View) Leading() bool {
	_, leading := v.Read()
	return leading
}

// Lapses returns when the contender's leadership lapses unless another heartbeat is acknowledged
// first: a heartbeat timeout after the newest acknowledged one was sent. Zero unless it leads.
func (v *View) Lapses() time.Time {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.leadingLocked() {
		return time.Time{}
	}
	return v.lastHeartbeat.Add(v.timeout)
}

// HeardWithin reports whether the contender leads, with its newest acknowledged heartbeat (or its
// assignment, when none came since) sent within d.
func (v *View) HeardWithin(d time.Duration) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.leadingLocked() && time.Since(v.lastHeartbeat) < d
}

// Fenced reports whether partitions are assigned but the contender does not lead them: it fenced
// itself, or no heartbeat was acknowledged within the timeout.
func (v *View) Fenced() bool {
	holds, leading := v.Read()
	return holds && !leading
}

// Partitions returns the partitions the contender leads now, in order: none unless it leads.
func (v *View) Partitions() []int32 {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.leadingLocked() {
		return nil
	}
	return slices.Clone(v.assigned)
}

// Held returns the partitions assigned, led or not, in order.
func (v *View) Held() []int32 {
	v.mu.Lock()
	defer v.mu.Unlock()
	return slices.Clone(v.assigned)
}

// acquire adds ps to the assigned partitions, and reports whether leadership begins with them
// (none was held before). A beginning lifts a fence: the coordinator has just vouched for the
// contender, whose session outlives a heartbeat timeout from now, so the assignment counts as a
// heartbeat acknowledged now.
func (v *View) acquire(ps []int32) (beginning bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	beginning = len(v.assigned) == 0
	v.assigned = slices.Compact(slices.Sorted(slices.Values(append(v.assigned, ps...))))
	if beginning {
		v.fenced = false
		v.lastHeartbeat = time.Now()
	}
	return beginning
}

// revoke removes ps from the assigned partitions, and returns those of them that were assigned,
// and whether the contender had fenced itself, in which case its barrier has run already.
func (v *View) revoke(ps []int32) (lost []int32, wasFenced bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	wasFenced = v.fenced
	v.assigned = slices.DeleteFunc(v.assigned, func(p int32) bool {
		if slices.Contains(ps, p) {
			lost = append(lost, p)
			return true
		}
		return false
	})
	if len(v.assigned) == 0 {
		v.fenced = false
	}
	return lost, wasFenced
}

// fenceIfSilent fences a contender that holds partitions and has had no heartbeat acknowledged
// within the timeout, and returns them; silent is false, and nothing changes, otherwise. Once
// fenced, it leads again only through a fresh assignment (acquire after every partition was
// revoked).
func (v *View) fenceIfSilent() (led []int32, silent bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.assigned) == 0 || v.fenced || time.Since(v.lastHeartbeat) < v.timeout {
		return nil, false
	}
	v.fenced = true
	return slices.Clone(v.assigned), true
}

// acknowledged records that a heartbeat sent at sentAt was acknowledged. It counts only while
// partitions are assigned and the contender has not fenced itself.
func (v *View) acknowledged(sentAt time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.assigned) > 0 && !v.fenced && sentAt.After(v.lastHeartbeat) {
		v.lastHeartbeat = sentAt
	}
}

// nextBeats returns the partitions the next round of heartbeats goes to: up to HeartbeatFanout of
// the assigned ones, taken in turn, so that within a heartbeat timeout every one is tried.
func (v *View) nextBeats() []int32 {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := len(v.assigned)
	if n == 0 {
		return nil
	}
	beats := make([]int32, 0, min(HeartbeatFanout, n))
	for i := range min(HeartbeatFanout, n) {
		beats = append(beats, v.assigned[(v.nextBeat+i)%n])
	}
	v.nextBeat = (v.nextBeat + HeartbeatFanout) % n
	return beats
}

// NewTenure returns a random tenure, which marks the heartbeats of one spell of leadership, so
// that the acknowledgements of an earlier spell's count for nothing.
func NewTenure() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// List writes partitions as logs and events name them: "0,3,5".
func List(ps []int32) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}
