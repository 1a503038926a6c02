package goharvest

// setDefaultPartitioner makes librdkafka partition as the Java client does (murmur2 of the key,
// see DefaultPartitioner), unless the configuration names a partitioner of its own.
func setDefaultPartitioner(producerConfig KafkaConfigMap) {
	if _, set := producerConfig["partitioner"]; !set {
		producerConfig["partitioner"] = DefaultPartitioner
	}
}
