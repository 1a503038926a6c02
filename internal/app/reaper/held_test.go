package reaper_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/outbox"
)

// heldOutbox is an outbox the operators' commands are tried on: the keys under harvest: that
// point at it (its table made), and its rows written and counted.
type heldOutbox struct {
	keys   string
	insert func(topic string) int64 // a row of key "k", returning its id
	rows   func(table string) int
}

// Operators list held records from the running reaper, move one to the dead-letter table (which
// releases its key at once) and requeue it at the tail.
func TestHeldDeadLetterAndRequeueCommands(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	if err := postgres.CreateOutboxTable(ctx, dsn, "outbox", outbox.TableOptions{}); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	heldCommands(t, "held", heldOutbox{
		keys: `dataSource: "` + dsn + `"`,
		insert: func(topic string) int64 {
			var id int64
			err := pool.QueryRow(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
				VALUES (now(), $1, 'k', 'v', '{}', '{}') RETURNING id`, topic).Scan(&id)
			if err != nil {
				t.Fatal(err)
			}
			return id
		},
		rows: func(table string) int {
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		},
	})
}

// heldCommands runs the operators' commands on o, through a reaper whose election and topics
// are named after name.
func heldCommands(t *testing.T, name string, o heldOutbox) {
	t.Helper()
	broker := kafkacluster.Shared(t)
	topic := broker.Topic(t, name+".events", 1)
	addr := freeAddr(t)
	config := writeFile(t, `harvest:
  baseKafkaConfig:
    bootstrap.servers: `+broker.Addr()+`
  leaderTopic: `+name+`.leader
  leaderGroupID: `+name+`
  `+o.keys+`
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
    heldCheckInterval: 100ms
admin:
  address: `+addr+`
`)
	bad := o.insert("bad topic!")
	o.insert(topic)

	stop := runReaper(t, config)
	defer stop()
	row := regexp.MustCompile(fmt.Sprintf(`(?m)^%d\s+bad topic!\s+"k"\s+\d+\s+\S+\s+refused by goharvest`, bad))
	eventually(t, "reaper held lists the bad record", 20*time.Second, func() (bool, string) {
		code, out := command(config, "held")
		return code == 0 && row.MatchString(out) && strings.Contains(out, "1 held"), out
	})
	eventually(t, "held metrics", 5*time.Second, func() (bool, string) {
		_, body := get("http://" + addr + "/metrics")
		return regexp.MustCompile(`goharvest_held_records\{harvest="[^"]+"\} 1\n`).MatchString(body) &&
			strings.Contains(body, "goharvest_held_record_oldest_age_seconds"), body[:min(len(body), 300)]
	})
	if n := o.rows("outbox"); n != 2 {
		t.Fatalf("%d rows in the outbox; the bad row's key should wait behind it", n)
	}

	if code, out := command(config, "dead-letter", fmt.Sprint(bad)); code != 0 {
		t.Fatalf("dead-letter: %d %s", code, out)
	}
	eventually(t, "the key released and its next record published", 10*time.Second, func() (bool, string) {
		code, out := command(config, "held")
		return code == 0 && o.rows("outbox") == 0 && strings.Contains(out, "0 held"), out
	})
	if n := o.rows("outbox_dead_letters"); n != 1 {
		t.Fatalf("%d dead letters, want the moved record", n)
	}
	if code, out := command(config, "dead-letter", fmt.Sprint(bad)); code == 0 || !strings.Contains(out, "no such record") {
		t.Fatalf("dead-letter of a moved row: %d %s", code, out)
	}

	code, out := command(config, "requeue", fmt.Sprint(bad))
	var newID int64
	if _, err := fmt.Sscanf(out, fmt.Sprintf("dead letter %d requeued as outbox record %%d", bad), &newID); code != 0 || err != nil || newID <= bad {
		t.Fatalf("requeue: %d %q (%v)", code, out, err)
	}
	eventually(t, "the requeued record held again", 10*time.Second, func() (bool, string) {
		_, out := command(config, "held")
		return strings.Contains(out, fmt.Sprintf("%d ", newID)), out
	})
	if code, out := command(config, "requeue", fmt.Sprint(bad)); code == 0 || !strings.Contains(out, "no such record") {
		t.Fatalf("requeue of a requeued dead letter: %d %s", code, out)
	}
	if code, out := command(config, "requeue", "x"); code != reaper.ExitUsage {
		t.Fatalf("requeue x: %d %s", code, out)
	}
	stop()
}
