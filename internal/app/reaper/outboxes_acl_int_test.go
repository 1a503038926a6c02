package reaper_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// One reaper of three outboxes on a broker that enforces ACLs, its user granted everything
// docs/operations.md lists for each but WRITE on the third outbox's topic: the third holds its
// records back (nothing of it reaches its topic) and /readyz names it alone, while the other two
// publish theirs. Granted WRITE, it publishes what waited. TestReaperManyOutboxesUnderLoadWithFaults
// runs the other faults under load on a plaintext broker; this one needs a Secure cluster, whose
// clients the verifier cannot join, so it counts rows and the topic's offsets instead.
func TestReaperOutboxWithoutTopicWriteHoldsBackOnlyItself(t *testing.T) {
	rig := &aclRig{kafka: kafkacluster.Start(t, kafkacluster.Secure()), client: "librdkafka"}
	const user, records = "reaper-outboxes", 30
	rig.kafka.NewUser(t, user)
	type acled struct {
		name string
		c    aclCase
		dsn  string
		pool *pgxpool.Pool
	}
	outboxes := make([]acled, 3)
	var entries strings.Builder
	for i := range outboxes {
		group := fmt.Sprintf("acl-outboxes-%d", i)
		c := aclCase{user: user, group: group, leaderTopic: group + ".leader", topic: group + ".events", shards: 1}
		rig.kafka.Topic(t, c.topic, 2)
		dsn, pool := prepareOutbox(t, c, records)
		outboxes[i] = acled{name: fmt.Sprintf("ob%d", i), c: c, dsn: dsn, pool: pool}
		needs := c.docsACLs()
		if i == 2 {
			needs = needs[:len(needs)-1] // WRITE on its topic, the last the docs list
		}
		rig.grant(t, needs)
		fmt.Fprintf(&entries, "  - outbox: %s\n    leaderTopic: %s\n    leaderGroupID: %s\n    dataSource: %q\n",
			outboxes[i].name, c.leaderTopic, c.group, dsn)
	}
	denied := outboxes[2]
	if need := denied.c.docsACLs()[6]; need.acl.Operation != kafka.ACLOperationWrite || need.acl.Name != denied.c.topic {
		t.Fatalf("the docs' last ACL is %v, not WRITE on the topic", need.acl)
	}
	addr := freeAddr(t)
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	os.WriteFile(config, []byte(rig.harvestYAML(t, user)+`outboxes:
`+entries.String()+`admin:
  address: `+addr+`
`), 0o600)
	run := startReaperRun(t, config)
	base := "http://" + addr
	for _, o := range outboxes[:2] {
		eventually(t, "outbox "+o.name+" drained", time.Minute, func() (bool, string) {
			return outboxRows(t, o.pool) == 0, run.logs.String()
		})
	}
	// The promise: readiness says which outbox is unwell. An outbox that can publish
	// nothing, every record held back by Kafka's refusal, is unwell; its leader reaches Postgres
	// and Kafka, which is all /readyz asks today, so this fails (see the issue 38 report).
	var body string
	if !testwait.Until(30*time.Second, func() bool {
		names, _, b := unready(base)
		body = b
		return len(names) == 1 && names[0] == denied.name
	}) {
		t.Errorf("/readyz does not name outbox %s, whose topic it may not write and whose records are all held back; it says: %s", denied.name, body)
	}
	if code, body := get(base + reaper.HeldPath + "?" + reaper.OutboxParam + "=" + denied.name); code != 200 || !strings.Contains(body, `"id"`) {
		t.Errorf("/held?outbox=%s: %d %s; want its held records", denied.name, code, body)
	}
	if rows, written := outboxRows(t, denied.pool), rig.written(t, denied.c.topic); rows != records || written != 0 {
		t.Fatalf("outbox %s without WRITE: %d of %d rows left, %d records on its topic; want all left, none written:\n%s",
			denied.name, rows, records, written, run.logs)
	}
	// The others go on publishing while it is held back.
	for _, o := range outboxes[:2] {
		insertRecords(t, o.pool, o.c.topic, records)
		eventually(t, "outbox "+o.name+" drained again", time.Minute, func() (bool, string) {
			return outboxRows(t, o.pool) == 0, run.logs.String()
		})
	}
	for _, o := range outboxes[:2] {
		if code, body := get(base + reaper.HeldPath + "?" + reaper.OutboxParam + "=" + o.name); code != 200 || strings.Contains(body, `"id"`) {
			t.Errorf("/held?outbox=%s: %d %s; want no held records", o.name, code, body)
		}
	}

	rig.grant(t, denied.c.docsACLs()[6:])
	eventually(t, "outbox "+denied.name+" drained once granted WRITE", time.Minute, func() (bool, string) {
		return outboxRows(t, denied.pool) == 0, run.logs.String()
	})
	if written := rig.written(t, denied.c.topic); written < records {
		t.Errorf("outbox %s: %d records on its topic, want at least %d", denied.name, written, records)
	}
	waitUnready(t, base, nil, time.Minute)
	if code := run.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, run.logs)
	}
}
