package reaper_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

// Operators list held records from the running reaper, move one to the dead-letter table (which
// releases its key at once) and requeue it at the tail.
func TestHeldDeadLetterAndRequeueCommands(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.NewDatabase(t)
	broker := kafkacluster.Shared(t)
	broker.Topic(t, "held.events", 1)
	addr := freeAddr(t)
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	os.WriteFile(config, []byte(`harvest:
  baseKafkaConfig:
    bootstrap.servers: `+broker.Addr()+`
  leaderTopic: held.leader
  leaderGroupID: held
  dataSource: "`+dsn+`"
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
    heldCheckInterval: 100ms
admin:
  address: `+addr+`
`), 0o600)
	command := func(args ...string) (int, string) {
		var stdout, stderr bytes.Buffer
		code := reaper.Main(append(args, "-f", config), reaper.Env{Stdout: &stdout, Stderr: &stderr, LookupEnv: os.LookupEnv, Context: ctx})
		return code, stdout.String() + stderr.String()
	}
	if code, out := command("init"); code != 0 || !strings.Contains(out, "outbox_dead_letters") {
		t.Fatalf("init: %d %s", code, out)
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	insert := func(topic string) int64 {
		var id int64
		err := pool.QueryRow(ctx, `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
			VALUES (now(), $1, 'k', 'v', '{}', '{}') RETURNING id`, topic).Scan(&id)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	bad := insert("bad topic!")
	insert("held.events")
	rows := func() int {
		var n int
		pool.QueryRow(ctx, "SELECT count(*) FROM outbox").Scan(&n)
		return n
	}

	stop := runReaper(t, config)
	row := regexp.MustCompile(fmt.Sprintf(`(?m)^%d\s+bad topic!\s+"k"\s+\d+\s+\S+\s+refused by goharvest`, bad))
	eventually(t, "reaper held lists the bad record", 20*time.Second, func() (bool, string) {
		code, out := command("held")
		return code == 0 && row.MatchString(out) && strings.Contains(out, "1 held"), out
	})
	eventually(t, "held metrics", 5*time.Second, func() (bool, string) {
		_, body := get("http://" + addr + "/metrics")
		return regexp.MustCompile(`goharvest_held_records\{harvest="[^"]+"\} 1\n`).MatchString(body) &&
			strings.Contains(body, "goharvest_held_record_oldest_age_seconds"), body[:min(len(body), 300)]
	})
	if rows() != 2 {
		t.Fatalf("%d rows in the outbox; the bad row's key should wait behind it", rows())
	}

	if code, out := command("dead-letter", fmt.Sprint(bad)); code != 0 {
		t.Fatalf("dead-letter: %d %s", code, out)
	}
	eventually(t, "the key released and its next record published", 10*time.Second, func() (bool, string) {
		code, out := command("held")
		return code == 0 && rows() == 0 && strings.Contains(out, "0 held"), out
	})
	if code, out := command("dead-letter", fmt.Sprint(bad)); code == 0 || !strings.Contains(out, "no such record") {
		t.Fatalf("dead-letter of a moved row: %d %s", code, out)
	}

	code, out := command("requeue", fmt.Sprint(bad))
	var newID int64
	if _, err := fmt.Sscanf(out, fmt.Sprintf("dead letter %d requeued as outbox record %%d", bad), &newID); code != 0 || err != nil || newID <= bad {
		t.Fatalf("requeue: %d %q (%v)", code, out, err)
	}
	eventually(t, "the requeued record held again", 10*time.Second, func() (bool, string) {
		_, out := command("held")
		return strings.Contains(out, fmt.Sprintf("%d ", newID)), out
	})
	if code, out := command("requeue", "x"); code != reaper.ExitUsage {
		t.Fatalf("requeue x: %d %s", code, out)
	}

	stop()
}
