package memory

import "github.com/goharvest/goharvest/driver"

// Kafka is an in-memory Kafka client (driver.Kafka) for a harvester: its producers publish to
// Broker and its electors join Election, so that goharvest.Config.Kafka can take it.
type Kafka struct {
	Broker   *Broker
	Election *Election
}

var _ driver.Kafka = Kafka{}

// NewKafka returns a client on a new broker and a new election of the given number of
// partitions (the harvester's shards).
func NewKafka(partitions int) Kafka {
	return Kafka{Broker: NewBroker(), Election: NewElection(partitions)}
}

// NewProducer implements driver.Kafka.
func (k Kafka) NewProducer(p driver.ProducerConfig) (driver.KafkaProducer, error) {
	return k.Broker.NewProducer(p.TransactionalID), nil
}

// NewElector implements driver.Kafka: the harvester joins Election as a contender.
func (k Kafka) NewElector(e driver.ElectorConfig) (driver.Elector, error) {
	return k.Election.Join(e.Barrier), nil
}
