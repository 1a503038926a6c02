// Package kafkaprops holds what goharvest's two Kafka clients share about the Kafka properties
// users write, which both name as librdkafka does: the properties goharvest owns, and why. The
// librdkafka client (driver/librdkafka, cgo) and the franz-go client (driver/franz, pure Go)
// refuse the same properties with the same reasons. The package needs no cgo, so that the franz
// client can import it.
package kafkaprops

// Election holds the properties that leader election sets itself, each with the reason: package
// neli's OwnedProperties, kept here because neli cannot be imported without cgo.
var Election = map[string]string{
	"group.id":                        "set from the leader group ID",
	"group.instance.id":               "set to one unique to each contender, so that a contender librdkafka drops from the group rejoins in its own place at once (see instanceID)",
	"enable.auto.commit":              "leader election commits no offsets",
	"enable.auto.offset.store":        "leader election commits no offsets",
	"auto.offset.reset":               "leader election commits no offsets and reads nothing it needs from the leader topic",
	"session.timeout.ms":              "derived from the heartbeat timeout so that a leader fences itself before its partition can be reassigned",
	"heartbeat.interval.ms":           "derived from the heartbeat timeout",
	"max.poll.interval.ms":            "derived from the heartbeat timeout",
	"partition.assignment.strategy":   "leader election relies on cooperative-sticky: balanced, moving as few partitions as it can, each revoked before it is assigned again",
	"group.protocol":                  "leader election uses the classic group protocol",
	"go.application.rebalance.enable": "leader election handles rebalances itself",
}

// Producer holds the properties goharvest sets on its producers, each with the reason: a value
// from the user would break the delivery guarantees.
var Producer = map[string]string{
	"enable.idempotence":         "always on: without it a retried batch can reorder a key's records",
	"transactional.id":           "set from LeaderGroupID, so that a new leader's producer fences its predecessors'",
	"go.delivery.reports":        "delivery reports decide whether a record is purged or reset",
	"delivery.report.only.error": "delivery reports decide whether a record is purged or reset",
	"acks":                       "always all: a record is purged only once every in-sync replica has it",
}

// Owned returns why goharvest owns the property key, if it does.
func Owned(key string) (why string, owned bool) {
	if why, ok := Election[key]; ok {
		return why, true
	}
	why, ok := Producer[key]
	return why, ok
}
