package goharvest

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/franz"
)

// KafkaClient names a Kafka client that a harvester makes from BaseKafkaConfig and
// ProducerKafkaConfig (Config.KafkaClient). Its YAML form is its string; Validate refuses any
// value but the constants below, and KafkaClientLibrdkafka in a build without cgo.
type KafkaClient string

// The Kafka clients.
const (
	// KafkaClientLibrdkafka is package driver/librdkafka: librdkafka through confluent-kafka-go,
	// with package neli's election. It needs cgo, so a build without cgo does not have it.
	KafkaClientLibrdkafka KafkaClient = "librdkafka"
	// KafkaClientFranz is package driver/franz: franz-go, in pure Go, configured by the
	// properties franz.FromProperties maps, which refuses the others, with an election of its
	// own on kgo's group client.
	KafkaClientFranz KafkaClient = "franz"
)

// DefaultKafkaClient returns Config.KafkaClient's default: KafkaClientFranz, in every build.
// It measured better than librdkafka on every benchmark but one on a one-node cluster and level
// on three (docs/performance.md), needs no cgo, and passes the same fault suite and soaks;
// KafkaClientLibrdkafka stays selectable in a build with cgo.
func DefaultKafkaClient() KafkaClient {
	return KafkaClientFranz
}

// kafkaClient returns the harvester's Kafka client: Config.Kafka, or the client KafkaClient
// chooses, made from BaseKafkaConfig and ProducerKafkaConfig. Validate has checked the config.
func (c Config) kafkaClient() (driver.Kafka, error) {
	switch {
	case c.Kafka != nil:
		return c.Kafka, nil
	case c.KafkaClient == KafkaClientFranz:
		cfg, problems := c.franzConfig()
		return franz.New(cfg), errors.Join(problems...)
	case c.KafkaClient == KafkaClientLibrdkafka:
		return librdkafkaClient(c)
	}
	return nil, unknownKafkaClient(c.KafkaClient)
}

// kafkaProblems are Validate's findings about the Kafka fields: a client both set and chosen, an
// unknown one, and the properties the chosen client refuses, each naming its field and key.
func (c Config) kafkaProblems() []error {
	if c.Kafka != nil {
		var errs []error
		if c.KafkaClient != "" {
			errs = append(errs, fmt.Errorf("KafkaClient (kafkaClient): %q chooses a client for goharvest to make, and Kafka is set to a client already; set one or the other", c.KafkaClient))
		}
		if len(c.BaseKafkaConfig) > 0 || len(c.ProducerKafkaConfig) > 0 {
			errs = append(errs, errors.New("BaseKafkaConfig (baseKafkaConfig): configures the client that KafkaClient chooses; Kafka is set, so configure that client instead"))
		}
		return errs
	}
	switch c.KafkaClient {
	case KafkaClientFranz:
		_, problems := c.franzConfig()
		return problems
	case KafkaClientLibrdkafka:
		return librdkafkaProblems(c)
	}
	return []error{unknownKafkaClient(c.KafkaClient)}
}

func unknownKafkaClient(name KafkaClient) error {
	return fmt.Errorf("KafkaClient (kafkaClient): %q: must be %q or %q", name, KafkaClientLibrdkafka, KafkaClientFranz)
}

// franzConfig returns the franz client's settings made from BaseKafkaConfig and
// ProducerKafkaConfig, and the properties it refuses.
func (c Config) franzConfig() (franz.Config, []error) {
	cfg, problems := franz.FromProperties(c.BaseKafkaConfig, c.ProducerKafkaConfig, c.Limits.QueueTimeout)
	var errs []error
	for _, p := range problems {
		errs = append(errs, propertyProblem(p.Producer, p.Property, p.Reason))
	}
	return cfg, errs
}

// propertyProblem is a client's refusal of a Kafka property, naming the field and YAML key that
// hold it.
func propertyProblem(producer bool, property, reason string) error {
	field, key := "BaseKafkaConfig", "baseKafkaConfig"
	if producer {
		field, key = "ProducerKafkaConfig", "producerKafkaConfig"
	}
	return fmt.Errorf("%s (%s.%s): %s", field, key, property, reason)
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
