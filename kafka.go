package goharvest

import "strconv"

// TransactionalID is the transactional ID of a shard's producers, which every harvester of the
// outbox shares for that shard: goharvest.<group>, or goharvest.<group>.<shard> when the outbox
// has more than one shard. Kafka lets one producer at a time use it, which is what fences an
// earlier leader of the shard.
func TransactionalID(leaderGroupID string, shard, shards int) string {
	if shards <= 1 {
		return TransactionalIDPrefix + leaderGroupID
	}
	return TransactionalIDPrefix + leaderGroupID + "." + strconv.Itoa(shard)
}
