package epoch

import (
	"slices"
	"strconv"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/outbox"
)

// message builds the Kafka message for an outbox record. The key is never nil: even the empty
// key "" is a key (converting a string to []byte always gives a non-nil slice), which the
// default partitioner hashes like any other rather than spreading it as it would a missing
// key. With idHeader set, the record's id follows its own headers, as decimal text.
func message(rec *outbox.Record, idHeader string, opaque any) driver.Message {
	var value []byte
	if rec.KafkaValue != nil {
		value = []byte(*rec.KafkaValue)
	}
	headers := rec.KafkaHeaders
	if idHeader != "" {
		// Clip, so that appending copies rather than writing into the record's array.
		headers = append(slices.Clip(headers), outbox.Header{Key: idHeader, Value: strconv.FormatInt(rec.ID, 10)})
	}
	return driver.Message{
		Topic:   rec.KafkaTopic,
		Key:     []byte(rec.KafkaKey),
		Value:   value,
		Headers: headers,
		Opaque:  opaque,
	}
}
