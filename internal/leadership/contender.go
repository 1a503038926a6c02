package leadership

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goharvest/goharvest/internal/outage"
	"github.com/goharvest/goharvest/internal/timing"
	"github.com/goharvest/goharvest/internal/wakegrid"
	"github.com/goharvest/goharvest/outbox"
)

// Contender is the part of a Fast NELI contender that no Kafka client decides: what it leads
// (its View, embedded, which any goroutine may read), how a leadership begins and ends (Acquire,
// Revoke, and the self-fence of a leader whose heartbeats go unacknowledged, each running the
// Barrier where the design needs it), whether the leader topic's size agrees with the
// configuration, and the heartbeats' bookkeeping (tenure, sequence, rounds, acknowledgements).
// Each election keeps one and adapts its client to it: package neli on librdkafka, driver/franz
// on kgo. The client joins and leaves the group, hands the contender the group's assignments and
// revocations, sends the heartbeats it asks for (Config.Send) and hands back their outcomes
// (Delivered); each of its pulses ends with EndPulse.
//
// Apart from the View's reads, its methods belong to the election's loop: one goroutine at a
// time, the one that pulses.
type Contender struct {
	*View
	cfg   Config
	every time.Duration // how often a leader sends a round of heartbeats
	kafka *outage.Logger

	topicReady    bool
	sizeUnknown   bool      // the leader topic's size could not be read at the last assignment
	sizeCheckedAt time.Time // when it was last asked
	tenure        string    // random, new when a leadership begins; marks its heartbeats
	seq           uint64    // heartbeat sequence within the tenure
	lastSent      time.Time // when the newest round of heartbeats was sent
	stopped       error     // what retrying cannot cure; the loop returns it
}

// Config is what a Contender needs of its election's configuration, defaults applied.
type Config struct {
	// Client names the election in its errors: "neli", "franz".
	Client string

	LeaderTopic   string
	LeaderGroupID string
	Name          string // the contender's, written into its heartbeats
	Partitions    int

	HeartbeatTimeout time.Duration
	MinPollInterval  time.Duration
	// OnWakeGrid times the rounds of heartbeats on the process's wake grid (package wakegrid),
	// so that the leaders of many outboxes in one process, and the loops that send their rounds,
	// wake together.
	OnWakeGrid bool

	// Send hands one heartbeat to the client, which reports its outcome through Delivered, on
	// the loop.
	Send func(Beat)
	// Barrier is the election's: driver.ElectorConfig's, neli.Config's. Optional.
	Barrier func(partitions []int32)
	// OnChange is told of every change of leadership, before the Barrier runs; optional.
	OnChange func(Change, []int32)

	Logger *slog.Logger
}

// Problems returns what is wrong with an election's settings whichever client runs it: the
// leader topic's and the group's names (Kafka's rules), the contender's name, and the durations
// (package timing's rules), defaults applied.
func Problems(leaderTopic, leaderGroupID, name string, durations timing.Election) []error {
	var errs []error
	if err := outbox.CheckName(leaderTopic); err != nil {
		errs = append(errs, fmt.Errorf("LeaderTopic %q: %w", leaderTopic, err))
	}
	if err := outbox.CheckName(leaderGroupID); err != nil {
		errs = append(errs, fmt.Errorf("LeaderGroupID %q: %w", leaderGroupID, err))
	}
	if strings.TrimSpace(name) == "" {
		errs = append(errs, errors.New("Name: required"))
	}
	for _, p := range durations.Problems() {
		errs = append(errs, fmt.Errorf("%s %v: %s", p.Field, p.Value, p.Reason))
	}
	return errs
}

// Change is a change of leadership, as OnChange is told of it.
type Change int

const (
	// Acquired: the contender leads these partitions now.
	Acquired Change = iota
	// SelfFenced: no heartbeat was acknowledged within the timeout; it stepped down from these.
	SelfFenced
	// Revoked: the group took these partitions from the contender.
	Revoked
)

// NewContender returns a contender that leads nothing yet.
func NewContender(cfg Config) *Contender {
	return &Contender{
		View:  newView(cfg.HeartbeatTimeout),
		cfg:   cfg,
		every: max(cfg.MinPollInterval, cfg.HeartbeatTimeout/10),
		kafka: &outage.Logger{What: "Kafka", Repeat: outage.LogInterval},
	}
}

// Err returns what stopped the contender (see Stop), or nil.
func (c *Contender) Err() error { return c.stopped }

// Stop records an error that retrying cannot cure, which the loop then returns.
func (c *Contender) Stop(err error) { c.stopped = err }

// KafkaFailed logs a Kafka outage (once as it begins, then every outage.LogInterval).
func (c *Contender) KafkaFailed(op string, err error) { c.kafka.Fail(c.cfg.Logger, op, err) }

// kafkaOK ends the Kafka outage going on, if any.
func (c *Contender) kafkaOK() { c.kafka.OK(c.cfg.Logger) }

// Permanent marks an error that retrying cannot cure, such as a permission missing.
type Permanent struct{ Err error }

func (e *Permanent) Error() string { return e.Err.Error() }
func (e *Permanent) Unwrap() error { return e.Err }

// TopicReady reports whether the leader topic was found ready (see PrepareTopic).
func (c *Contender) TopicReady() bool { return c.topicReady }

// PrepareTopic runs prepare, which makes the leader topic ready for the contender to join the
// group, until it succeeds once: it reports whether the topic is ready, and prepare's error if it
// is Permanent. Anything else is an outage, logged, for the next Pulse to retry.
func (c *Contender) PrepareTopic(prepare func() error) (ready bool, err error) {
	if c.topicReady {
		return true, nil
	}
	err = prepare()
	var p *Permanent
	if errors.As(err, &p) {
		return false, p.Err
	}
	if err != nil {
		c.KafkaFailed("prepare the leader topic", err)
		return false, nil
	}
	c.topicReady = true
	return true, nil
}

// SizeRead takes up how many partitions the leader topic has, as Kafka told it when the group
// last assigned the contender (0: Kafka did not say); it reports false, and stops the
// contender, when they are more than it is configured for.
//
// The client asks at every rebalance, with nothing new assigned too. A contender configured for
// more partitions grows the topic before it joins, and being assigned no partition at or above
// its own count does not show a contender that the others agree with it: the balancer can give
// the new partitions to the one that grew them and leave the others what they had, and the two
// would then split the keys differently, the same key in two shards with two leaders. The
// topic's size shows it. When Kafka does not say, the loop asks again once a heartbeat timeout
// (see EndPulse) until it does.
func (c *Contender) SizeRead(inTopic int) bool {
	c.sizeCheckedAt, c.sizeUnknown = time.Now(), inTopic == 0
	if inTopic > c.cfg.Partitions {
		c.Stop(c.mismatch(fmt.Sprintf("leader topic %s has %d partitions, and this contender is configured for %d",
			c.cfg.LeaderTopic, inTopic, c.cfg.Partitions)))
		return false
	}
	return true
}

func (c *Contender) mismatch(what string) error {
	return fmt.Errorf("%s: %s: a member of group %s runs with a different number of partitions (shards); "+
		"stop them all and start them with one setting", c.cfg.Client, what, c.cfg.LeaderGroupID)
}

// EndPulse ends one of the election's pulses, once the client has handed over the group's
// changes: it asks the leader topic's size again if it is still unknown a heartbeat timeout after
// it was last asked (size; see SizeRead), takes the heartbeats' outcomes (deliveries, which hands
// them to Delivered), fences a leader whose heartbeats went unacknowledged, which must then
// leave the group (leave; see fenceIfSilent), and sends a round of heartbeats if one is due. It
// returns whether the contender leads, and the error that stopped it.
func (c *Contender) EndPulse(size func() int, deliveries func(), leave func()) (leading bool, err error) {
	if c.sizeUnknown && time.Since(c.sizeCheckedAt) >= c.cfg.HeartbeatTimeout {
		c.SizeRead(size())
	}
	deliveries()
	if c.fenceIfSilent() {
		leave()
	}
	if c.Leading() && !time.Now().Before(c.NextBeat()) {
		c.sendHeartbeats()
	}
	if c.stopped != nil {
		return false, c.stopped
	}
	return c.Leading(), nil
}

// Acquire takes up partitions the group assigned. A leadership that begins with them has a new
// tenure, and sends its first round of heartbeats at once.
func (c *Contender) Acquire(ps []int32) {
	if len(ps) == 0 {
		return
	}
	if last := slices.Max(ps); int(last) >= c.cfg.Partitions {
		// Another contender of this group created or grew the topic for more partitions than
		// this one is configured for: leading with different partition counts would split the
		// work two ways at once.
		c.Stop(c.mismatch(fmt.Sprintf("assigned partition %d of leader topic %s, which should have %d partitions",
			last, c.cfg.LeaderTopic, c.cfg.Partitions)))
		return
	}
	beginning := c.View.acquire(ps)
	if beginning {
		c.tenure = NewTenure()
		c.seq = 0
	}
	c.kafkaOK()
	c.cfg.Logger.Info("acquired leadership", "partitions", List(ps))
	c.changed(Acquired, ps)
	if beginning {
		c.sendHeartbeats()
	}
}

// Revoke lets go of partitions the group took back (or that the contender gives up as it leaves),
// and runs the Barrier for those it led, unless it fenced itself, which ran it already.
func (c *Contender) Revoke(ps []int32) {
	lost, wasFenced := c.View.revoke(ps)
	if len(lost) == 0 {
		return
	}
	c.cfg.Logger.Info("leadership revoked", "partitions", List(lost))
	c.changed(Revoked, lost)
	if !wasFenced {
		c.barrier(lost)
	}
}

// RevokeAll lets go of every partition held, as Revoke does.
func (c *Contender) RevokeAll() { c.Revoke(c.Held()) }

// fenceIfSilent fences a leader whose heartbeats have stopped being acknowledged, runs the
// Barrier, and reports true: the client must then leave the group and join it again. An
// acknowledged heartbeat proves only that the leader reaches a broker, not that it is still a
// member, so leadership comes back only through a fresh assignment from the coordinator.
func (c *Contender) fenceIfSilent() bool {
	led, silent := c.View.fenceIfSilent()
	if !silent {
		return false
	}
	c.cfg.Logger.Warn("no heartbeat acknowledged within the timeout; stepping down and rejoining the group",
		"heartbeatTimeout", c.cfg.HeartbeatTimeout)
	c.changed(SelfFenced, led)
	c.barrier(led)
	return true
}

func (c *Contender) changed(ch Change, ps []int32) {
	if c.cfg.OnChange != nil {
		c.cfg.OnChange(ch, ps)
	}
}

func (c *Contender) barrier(ps []int32) {
	if c.cfg.Barrier != nil {
		c.cfg.Barrier(ps)
	}
}

// Beat is one heartbeat, from its sending to its outcome. The client asks only the partition's
// leader to acknowledge it (acks=1), and its acknowledgement is the evidence: it shows that this
// contender reached Kafka after the heartbeat was sent, which is all a heartbeat can prove
// (membership, and with it every partition, is lost at once or not at all; see package neli's
// doc, Safety). Waiting for every in-sync replica instead (acks=all), or reading the heartbeat
// back (which waits for the high watermark, and so for every in-sync replica too), would tie
// every leader to every broker that holds a replica: a crashed broker stays in sync until the
// controller fences it, 9s by default, longer than the default heartbeat timeout.
type Beat struct {
	Partition int32
	Tenure    string
	SentAt    time.Time
	Value     []byte // "name|tenure|seq"
}

// HeartbeatEvery is how often a leader sends a round of heartbeats: a tenth of the heartbeat
// timeout, or the minimum poll interval if that is longer.
func (c *Contender) HeartbeatEvery() time.Duration { return c.every }

// NextBeat returns when the next round of heartbeats is due: HeartbeatEvery after the last, or
// with OnWakeGrid the first point after it of the process's wake grid (rounds are then never
// further apart than HeartbeatEvery; the first after a leadership begins may come sooner). Zero
// before the first round.
func (c *Contender) NextBeat() time.Time {
	switch {
	case c.lastSent.IsZero():
		return c.lastSent
	case c.cfg.OnWakeGrid:
		return wakegrid.Next(c.lastSent, c.every)
	}
	return c.lastSent.Add(c.every)
}

// sendHeartbeats sends a round of heartbeats, each to one of the partitions the contender leads,
// taking them in turn, so that within a heartbeat timeout every partition led (up to ten rounds
// of HeartbeatFanout) is tried.
func (c *Contender) sendHeartbeats() {
	beats := c.View.nextBeats()
	if len(beats) == 0 {
		return
	}
	now := time.Now()
	c.lastSent = now
	for _, partition := range beats {
		c.cfg.Send(c.Heartbeat(partition, now))
	}
}

// Heartbeat returns the tenure's next heartbeat, for partition, sent at sentAt. The client calls it
// itself only to send a heartbeat again elsewhere, keeping the first one's sentAt.
func (c *Contender) Heartbeat(partition int32, sentAt time.Time) Beat {
	c.seq++
	return Beat{
		Partition: partition,
		Tenure:    c.tenure,
		SentAt:    sentAt,
		Value:     []byte(c.cfg.Name + "|" + c.tenure + "|" + strconv.FormatUint(c.seq, 10)),
	}
}

// Delivered takes up a heartbeat's outcome: err is nil when the partition's leader acknowledged
// it. It returns err for the client to handle (see HeartbeatFailed) if the heartbeat is of the
// current tenure, and nil otherwise. The client hands outcomes over on the loop, not as they
// come: a leader whose loop stalls must read as fenced once the timeout passes, so only the loop
// may vouch that it still runs. Once fenced, an acknowledgement restores nothing: only a fresh
// assignment does.
func (c *Contender) Delivered(b Beat, err error) error {
	if b.Tenure != c.tenure {
		return nil // from an earlier tenure
	}
	if err != nil {
		return err
	}
	c.View.acknowledged(b.SentAt)
	c.kafkaOK()
	return nil
}

// HeartbeatFailed handles a heartbeat that Kafka refused or that timed out; denied says Kafka
// refused it for lack of WRITE on the leader topic, taken away while the election runs, which
// stops the contender.
func (c *Contender) HeartbeatFailed(err error, denied bool) {
	if denied {
		c.Stop(c.Refused(WriteHeartbeats, err))
		return
	}
	c.KafkaFailed("publish heartbeat", err)
}

// Refusal is an operation of the election's that Kafka refuses for want of an ACL.
type Refusal int

const (
	JoinGroup       Refusal = iota // READ on the group
	ReadTopic                      // READ on the leader topic, to take up the partitions assigned
	WriteHeartbeats                // WRITE on the leader topic
	DescribeTopic                  // any operation on the leader topic, to learn what it may do
)

// Refused returns the error for an operation Kafka refused (cause), naming the ACL that would
// allow it. Retrying cannot cure it: an election whose permissions are taken away while it runs
// stops, rather than leading each partition it is given for a heartbeat timeout, fencing itself
// and rejoining, for ever.
func (c *Contender) Refused(op Refusal, cause error) error {
	switch op {
	case JoinGroup:
		return c.permissionError("may not join the group", cause, "READ on group "+c.cfg.LeaderGroupID)
	case ReadTopic:
		return c.permissionError("may not read the leader topic", cause, "READ on topic "+c.cfg.LeaderTopic)
	case WriteHeartbeats:
		return c.permissionError("may not write heartbeats to the leader topic", cause, "WRITE on topic "+c.cfg.LeaderTopic)
	}
	return c.permissionError("may not describe the leader topic", cause, "READ and WRITE on topic "+c.cfg.LeaderTopic)
}

// permissionError says what this contender may not do, and which ACL would allow it. cause may be
// nil.
func (c *Contender) permissionError(what string, cause error, grant string) error {
	if cause != nil {
		return fmt.Errorf("%s: group %s, leader topic %s: this client %s (%w): grant %s", c.cfg.Client, c.cfg.LeaderGroupID, c.cfg.LeaderTopic, what, cause, grant)
	}
	return fmt.Errorf("%s: group %s, leader topic %s: this client %s: grant %s", c.cfg.Client, c.cfg.LeaderGroupID, c.cfg.LeaderTopic, what, grant)
}

// MissingPermissions returns the Permanent error for a contender that may not read or write the
// leader topic (KIP-430 tells a client which operations it may perform), or nil if it may do
// both. It checks before it joins the group: without WRITE it cannot send heartbeats, without
// READ it cannot take up the partitions it is assigned, and either way it would be given
// partitions, lead each for a heartbeat timeout, fence itself and rejoin, for ever.
func (c *Contender) MissingPermissions(read, write bool) error {
	var missing []string
	if !read {
		missing = append(missing, "READ")
	}
	if !write {
		missing = append(missing, "WRITE")
	}
	if len(missing) == 0 {
		return nil
	}
	return &Permanent{c.permissionError("may not "+strings.ToLower(strings.Join(missing, " or "))+
		" the leader topic (to take up the partitions it is assigned and send heartbeats)",
		nil, strings.Join(missing, " and ")+" on topic "+c.cfg.LeaderTopic)}
}

// TopicTooLarge is the Permanent error for a leader topic of have partitions, more than the
// contender is configured for, which it cannot shrink.
func (c *Contender) TopicTooLarge(have int) error {
	return &Permanent{fmt.Errorf("%s: leader topic %s has %d partitions, more than the %d configured: "+
		"Kafka cannot remove partitions, so use a new leader topic for fewer (see docs/operations.md, Scaling out)",
		c.cfg.Client, c.cfg.LeaderTopic, have, c.cfg.Partitions)}
}

// MayNotCreateTopic is the Permanent error for a contender refused (cause) creating the leader
// topic or adding partitions to it.
func (c *Contender) MayNotCreateTopic(cause error) error {
	want := c.cfg.Partitions
	return &Permanent{fmt.Errorf("%s: leader topic %s needs %d partition(s) and this client may not create it "+
		"or add partitions (%v): create it with %d partition(s), or grant CREATE and ALTER on it", c.cfg.Client, c.cfg.LeaderTopic, want, cause, want)}
}
