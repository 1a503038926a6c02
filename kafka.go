package goharvest

import (
	"strconv"

	"github.com/goharvest/goharvest/driver"
)

// kafkaClient returns the harvester's Kafka client: Config.Kafka, or the default client made
// from BaseKafkaConfig and ProducerKafkaConfig (librdkafka, in a build with cgo).
func (c Config) kafkaClient() (driver.Kafka, error) {
	if c.Kafka != nil {
		return c.Kafka, nil
	}
	return defaultKafka(c)
}

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
