package mysql_test

import (
	"context"
	"errors"
	"testing"

	"github.com/goharvest/goharvest/driver/mysql"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
	"github.com/goharvest/goharvest/outbox"
)

// An operator's dead-letter moves the row, with the reason, into the dead-letter table; requeue
// brings it back at the tail of the outbox, under a new id, and empties the dead letter. Both
// say when there is no such row.
func TestDeadLetterNowAndRequeue(t *testing.T) {
	ctx := context.Background()
	dataSource := mariadbtest.NewOutbox(t)
	db := mariadbtest.Open(t, dataSource)
	value := "v"
	r := rec("k", value)
	r.KafkaHeaders = append(r.KafkaHeaders, outbox.Header{Key: "h", Value: "1"})
	id := insert(t, db, "outbox", r)
	later := insert(t, db, "outbox", rec("k", "later"))
	if err := mysql.DeadLetterNow(ctx, dataSource, "outbox", id, "an operator said so"); err != nil {
		t.Fatal(err)
	}
	var (
		reason, headers string
		attempts        int
	)
	if err := db.QueryRow(`SELECT error, attempts, kafka_header_values FROM outbox_dead_letters WHERE id = ?`, id).Scan(&reason, &attempts, &headers); err != nil {
		t.Fatalf("the dead letter of record %d: %v", id, err)
	}
	if reason != "an operator said so" || headers != `["1"]` {
		t.Errorf("dead letter %d: error %q, header values %s", id, reason, headers)
	}
	if err := mysql.DeadLetterNow(ctx, dataSource, "outbox", id, "again"); !errors.Is(err, mysql.ErrNoSuchRecord) {
		t.Errorf("dead-lettering record %d a second time: %v", id, err)
	}
	newID, err := mysql.Requeue(ctx, dataSource, "outbox", id)
	if err != nil {
		t.Fatal(err)
	}
	if newID <= later {
		t.Errorf("requeued as %d, not behind record %d written meanwhile", newID, later)
	}
	var topic, key, got string
	if err := db.QueryRow(`SELECT kafka_topic, kafka_key, kafka_value FROM outbox WHERE id = ?`, newID).Scan(&topic, &key, &got); err != nil {
		t.Fatal(err)
	}
	if topic != r.KafkaTopic || key != r.KafkaKey || got != value {
		t.Errorf("requeued as topic %q key %q value %q", topic, key, got)
	}
	if _, err := mysql.Requeue(ctx, dataSource, "outbox", id); !errors.Is(err, mysql.ErrNoSuchRecord) {
		t.Errorf("requeueing dead letter %d a second time: %v", id, err)
	}
}
