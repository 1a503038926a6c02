package epoch

import (
	"testing"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/outbox"
)

func TestMessage(t *testing.T) {
	headers := make(outbox.Headers, 1, 4) // room to append into, which message must not use
	headers[0] = outbox.Header{Key: "a", Value: "1"}
	rec := driver.OutboxRecord{ID: 12345, KafkaTopic: "t", KafkaKey: "", KafkaValue: outbox.String("\x00v"), KafkaHeaders: headers}

	m := message(&rec, "", "opaque")
	if m.Key == nil || len(m.Key) != 0 {
		t.Errorf("the empty key became %#v; it must stay a key (non-nil, empty), or the partitioner spreads it", m.Key)
	}
	if string(m.Value) != "\x00v" || m.Topic != "t" || m.Opaque != "opaque" || len(m.Headers) != 1 {
		t.Errorf("got %+v", m)
	}

	m = message(&rec, "goharvest-id", nil)
	if len(m.Headers) != 2 || m.Headers[0] != headers[0] || m.Headers[1] != (outbox.Header{Key: "goharvest-id", Value: "12345"}) {
		t.Errorf("headers %v, want the record's and then goharvest-id=12345", m.Headers)
	}
	if extra := headers[:2][1]; extra != (outbox.Header{}) {
		t.Errorf("message wrote %v into the record's header array", extra)
	}

	tombstone := driver.OutboxRecord{KafkaKey: "k"}
	if m := message(&tombstone, "", nil); m.Value != nil {
		t.Errorf("a NULL value became %#v, want nil (a tombstone)", m.Value)
	}
	if m := message(&driver.OutboxRecord{KafkaValue: outbox.String("")}, "", nil); m.Value == nil {
		t.Error("an empty value became a tombstone")
	}
}
