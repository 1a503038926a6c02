package reaper_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
)

// aclRig is a Secure cluster (SASL_SSL, SCRAM, ACLs enforced) on which each scenario runs a
// reaper as a user of its own, with a group, leader topic, target topic and database of its own.
type aclRig struct {
	kafka  *kafkacluster.Cluster
	n      int
	client string // the reapers' kafkaClient
}

// aclCase is one reaper's setting: its user, names and the ACLs it is granted.
type aclCase struct {
	user, group, leaderTopic, topic string
	shards                          int
}

func (r *aclRig) newCase(t *testing.T, shards int) aclCase {
	r.n++
	group := fmt.Sprintf("acl-%s%d", r.client, r.n)
	c := aclCase{user: "reaper-" + group, group: group, leaderTopic: group + ".leader", topic: group + ".events", shards: shards}
	r.kafka.Topic(t, c.topic, 2)
	r.kafka.NewUser(t, c.user)
	return c
}

// aclNeed is one ACL docs/operations.md lists, and what the reaper does without it: stop with an error
// that says what to grant, or keep running (holding back the records it cannot publish) and log it.
type aclNeed struct {
	acl   kafkacluster.ACL
	stops bool
	says  string
}

// docsACLs are the ACLs docs/operations.md's table lists for case c (see TestDocsListTheTestedACLs),
// with the leader topic created by the reaper.
func (c aclCase) docsACLs() []aclNeed {
	allow := func(op kafka.ACLOperation, rt kafka.ResourceType, name string) kafkacluster.ACL {
		return kafkacluster.ACL{User: c.user, Operation: op, Resource: rt, Name: name}
	}
	txn := allow(kafka.ACLOperationWrite, kafkacluster.ResourceTransactionalID, "goharvest."+c.group)
	if c.shards > 1 {
		txn.Name += "."
		txn.Pattern = kafka.ResourcePatternTypePrefixed
	}
	return []aclNeed{
		{txn, true, "grant WRITE on TransactionalId goharvest." + c.group},
		{allow(kafka.ACLOperationRead, kafka.ResourceGroup, c.group), true, "grant READ on group " + c.group},
		{allow(kafka.ACLOperationRead, kafka.ResourceGroup, c.group+".notes"), true, "grant READ on group " + c.group + ".notes"},
		{allow(kafka.ACLOperationRead, kafka.ResourceTopic, c.leaderTopic), true, "grant READ on topic " + c.leaderTopic},
		{allow(kafka.ACLOperationWrite, kafka.ResourceTopic, c.leaderTopic), true, "grant WRITE on topic " + c.leaderTopic},
		{allow(kafka.ACLOperationCreate, kafka.ResourceTopic, c.leaderTopic), true, "grant CREATE and ALTER on it"},
		{allow(kafka.ACLOperationWrite, kafka.ResourceTopic, c.topic), false, "grant WRITE on topic " + c.topic},
	}
}

func acls(needs []aclNeed) []kafkacluster.ACL {
	out := make([]kafkacluster.ACL, len(needs))
	for i, n := range needs {
		out[i] = n.acl
	}
	return out
}

// reaperRun is a reaper running in this process.
type reaperRun struct {
	cancel context.CancelFunc
	done   chan int
	logs   *syncbuf.Buffer
	config string
}

func (r *aclRig) startReaper(t *testing.T, c aclCase, dsn string) *reaperRun {
	config := filepath.Join(t.TempDir(), "reaper.yaml")
	os.WriteFile(config, []byte(r.harvestYAML(t, c.user)+`  leaderTopic: `+c.leaderTopic+`
  leaderGroupID: `+c.group+`
  dataSource: "`+dsn+`"
  shards: `+fmt.Sprint(c.shards)+`
`), 0o600)
	return startReaperRun(t, config)
}

// harvestYAML is the start of a reaper file's harvest: for user on r's cluster: the Kafka
// client and its settings, and short limits.
func (r *aclRig) harvestYAML(t *testing.T, user string) string {
	props, err := r.kafka.ClientConfig(user)
	if err != nil {
		t.Fatal(err)
	}
	var kafkaConfig strings.Builder
	for _, k := range slices.Sorted(maps.Keys(props)) {
		fmt.Fprintf(&kafkaConfig, "    %s: %q\n", k, props[k])
	}
	return `harvest:
  kafkaClient: ` + r.client + `
  baseKafkaConfig:
` + kafkaConfig.String() + `  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
    ioErrorBackoff: 200ms
    maxKeyRun: 10
`
}

// startReaperRun runs the reaper of config in this process until the test ends.
func startReaperRun(t *testing.T, config string) *reaperRun {
	ctx, cancel := context.WithCancel(context.Background())
	run := &reaperRun{cancel: cancel, done: make(chan int, 1), logs: &syncbuf.Buffer{}, config: config}
	go func() {
		run.done <- reaper.Main([]string{"-f", config}, reaper.Env{Stdout: run.logs, Stderr: run.logs, LookupEnv: os.LookupEnv, Context: ctx})
	}()
	t.Cleanup(func() { run.stop(t) })
	return run
}

// stop stops the reaper unless it has stopped, and returns its exit code.
func (run *reaperRun) stop(t *testing.T) int {
	run.cancel()
	select {
	case code := <-run.done:
		run.done <- code
		return code
	case <-time.After(30 * time.Second):
		t.Fatalf("the reaper did not stop; logs:\n%s", run.logs)
		return -1
	}
}

// drains waits until the outbox is empty, then stops the reaper, which must exit 0.
func (run *reaperRun) drains(t *testing.T, what string, pool *pgxpool.Pool) {
	t.Helper()
	eventually(t, what, 60*time.Second, func() (bool, string) {
		return outboxRows(t, pool) == 0, run.logs.String()
	})
	if code := run.stop(t); code != 0 {
		t.Fatalf("exit %d:\n%s", code, run.logs)
	}
}

// stops waits until the reaper exits, which it must do within 30s, with ExitFailed and an error
// saying says.
func (run *reaperRun) stops(t *testing.T, says string) {
	t.Helper()
	select {
	case code := <-run.done:
		run.done <- code
		if code != reaper.ExitFailed || !strings.Contains(run.logs.String(), says) {
			t.Fatalf("exit %d, want %d and an error saying %q:\n%s", code, reaper.ExitFailed, says, run.logs)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("still running after 30s, want it stopped saying %q:\n%s", says, run.logs)
	}
}

// grant grants needs' ACLs, failing the test if it cannot.
func (r *aclRig) grant(t *testing.T, needs []aclNeed) {
	t.Helper()
	if err := r.kafka.Grant(acls(needs)...); err != nil {
		t.Fatal(err)
	}
}

// prepareOutbox creates the outbox (with the shard index) and fills it with records for topic.
func prepareOutbox(t *testing.T, c aclCase, records int) (dsn string, pool *pgxpool.Pool) {
	ctx := context.Background()
	dsn = pgtest.NewDatabase(t)
	config := filepath.Join(t.TempDir(), "init.yaml")
	os.WriteFile(config, []byte(`harvest:
  baseKafkaConfig:
    bootstrap.servers: unused:9092
  leaderTopic: `+c.leaderTopic+`
  leaderGroupID: `+c.group+`
  dataSource: "`+dsn+`"
  shards: `+fmt.Sprint(c.shards)+`
`), 0o600)
	var out strings.Builder
	if code := reaper.Main([]string{"init", "-f", config}, reaper.Env{Stdout: &out, Stderr: &out, LookupEnv: os.LookupEnv, Context: ctx}); code != 0 {
		t.Fatalf("init: %d %s", code, out.String())
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	insertRecords(t, pool, c.topic, records)
	return dsn, pool
}

// insertRecords writes records for topic over 10 keys.
func insertRecords(t *testing.T, pool *pgxpool.Pool, topic string, records int) {
	if _, err := pool.Exec(context.Background(), `INSERT INTO outbox (create_time, kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
		SELECT now(), $1, 'k' || (i % 10), 'v' || i, '{}', '{}' FROM generate_series(1, $2) AS i`, topic, records); err != nil {
		t.Fatal(err)
	}
}

func outboxRows(t *testing.T, pool *pgxpool.Pool) int {
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// written returns how many records, committed or not, the topic's partitions hold: the sum of
// their high watermarks, read as the super user.
func (r *aclRig) written(t *testing.T, topic string) int64 {
	cm := r.kafka.ConfigMap(t, kafkacluster.AdminUser)
	cm["group.id"] = "acl-watermarks"
	cons, err := kafka.NewConsumer(&cm)
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	var sum int64
	for p := range int32(2) {
		_, high, err := cons.QueryWatermarkOffsets(topic, p, 10000)
		if err != nil {
			t.Fatal(err)
		}
		sum += high
	}
	return sum
}

// The reaper publishes with exactly the ACLs docs/operations.md lists, one harvester or shards, runs of keys
// and notes included; without any one of them it publishes nothing and loses nothing, and says
// what to grant: it stops, or, for a target topic it may not write, holds back that topic's
// records and logs it. So with either Kafka client.
func TestReaperACLs(t *testing.T) {
	kafka := kafkacluster.Start(t, kafkacluster.Secure())
	for _, client := range []string{"librdkafka", "franz"} {
		t.Run(client, func(t *testing.T) { reaperACLs(t, &aclRig{kafka: kafka, client: client}) })
	}
}

// reaperACLs is TestReaperACLs with rig's client.
func reaperACLs(t *testing.T, rig *aclRig) {
	const records = 20
	for _, shards := range []int{1, 4} {
		t.Run(fmt.Sprintf("shards=%d", shards), func(t *testing.T) {
			t.Run("the documented ACLs", func(t *testing.T) {
				c := rig.newCase(t, shards)
				dsn, pool := prepareOutbox(t, c, records)
				rig.grant(t, c.docsACLs())
				rig.startReaper(t, c, dsn).drains(t, "the outbox drained", pool)
			})
			for i := range len(aclCase{shards: shards}.docsACLs()) {
				c := rig.newCase(t, shards)
				needs := c.docsACLs()
				missing := needs[i]
				t.Run("without "+strings.ReplaceAll(missing.acl.String(), c.group, "<group>"), func(t *testing.T) {
					dsn, pool := prepareOutbox(t, c, records)
					rig.grant(t, slices.Delete(slices.Clone(needs), i, i+1))
					run := rig.startReaper(t, c, dsn)
					if missing.stops {
						run.stops(t, missing.says)
					} else {
						eventually(t, "a log line saying "+missing.says, 30*time.Second, func() (bool, string) {
							return strings.Contains(run.logs.String(), missing.says), run.logs.String()
						})
						if code := run.stop(t); code != 0 {
							t.Fatalf("exit %d:\n%s", code, run.logs)
						}
					}
					checkNothingPublished(t, rig, c, pool, records, run)
				})
			}

			// Another principal, with every ACL but the group's transactional IDs, joins the group
			// and is left alone with it: it stops without publishing, and the group's own reaper,
			// started again, publishes what was written meanwhile.
			t.Run("another principal without the transactional ID", func(t *testing.T) {
				c := rig.newCase(t, shards)
				dsn, pool := prepareOutbox(t, c, records)
				rig.grant(t, c.docsACLs())
				run := rig.startReaper(t, c, dsn)
				eventually(t, "the outbox drained", 60*time.Second, func() (bool, string) {
					return outboxRows(t, pool) == 0, run.logs.String()
				})
				intruder := c
				intruder.user = c.user + "-other"
				rig.kafka.NewUser(t, intruder.user)
				needs := intruder.docsACLs()
				rig.grant(t, needs[1:])
				other := rig.startReaper(t, intruder, dsn)
				eventually(t, "the other principal's reaper in the election", 30*time.Second, func() (bool, string) {
					return strings.Contains(other.logs.String(), "joined the election"), other.logs.String()
				})
				if code := run.stop(t); code != 0 {
					t.Fatalf("exit %d:\n%s", code, run.logs)
				}
				before := rig.written(t, c.topic)
				insertRecords(t, pool, c.topic, records)
				other.stops(t, needs[0].says)
				if rows, written := outboxRows(t, pool), rig.written(t, c.topic); rows != records || written != before {
					t.Fatalf("%d of %d rows left, %d records written by the other principal; want all left, none written:\n%s",
						rows, records, written-before, other.logs)
				}
				rig.startReaper(t, c, dsn).drains(t, "the group's reaper publishing again", pool)
			})
		})
	}

	// A leader topic with fewer partitions than shards is grown, which needs ALTER on it.
	t.Run("growing the leader topic", func(t *testing.T) {
		c := rig.newCase(t, 4)
		rig.kafka.Topic(t, c.leaderTopic, 1)
		dsn, pool := prepareOutbox(t, c, records)
		rig.grant(t, c.docsACLs())
		run := rig.startReaper(t, c, dsn)
		run.stops(t, "grant CREATE and ALTER on it")
		checkNothingPublished(t, rig, c, pool, records, run)
		if err := rig.kafka.Grant(kafkacluster.ACL{User: c.user, Operation: kafka.ACLOperationAlter, Resource: kafka.ResourceTopic, Name: c.leaderTopic}); err != nil {
			t.Fatal(err)
		}
		rig.startReaper(t, c, dsn).drains(t, "the outbox drained with ALTER", pool)
	})
}

// checkNothingPublished fails the test unless every record is still in the outbox and nothing,
// committed or not, reached the topic.
func checkNothingPublished(t *testing.T, rig *aclRig, c aclCase, pool *pgxpool.Pool, records int, run *reaperRun) {
	t.Helper()
	if rows, written := outboxRows(t, pool), rig.written(t, c.topic); rows != records || written != 0 {
		t.Fatalf("%d of %d rows left in the outbox, %d records written to %s; want all left, none written:\n%s",
			rows, records, written, c.topic, run.logs)
	}
}

// docs/operations.md's table of ACLs is what TestReaperACLs grants, for one leader and for shards, and ALTER
// on the leader topic, which growing it needs: no more, no fewer.
func TestDocsListTheTestedACLs(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	const header = "| Operation | Resource | Name | Pattern | Why |"
	_, table, ok := strings.Cut(string(readme), header+"\n|---|---|---|---|---|\n")
	if !ok {
		t.Fatalf("docs/operations.md has no table headed %q", header)
	}
	var listed []string
	for line := range strings.Lines(table) {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), " | ")
		if len(cells) != 5 {
			t.Fatalf("docs/operations.md's ACL row %q has %d cells, want 5", line, len(cells))
		}
		row := fmt.Sprintf("%s on %s %s", strings.TrimSpace(cells[0]), cells[1], strings.Trim(cells[2], "`"))
		if cells[3] == "PREFIXED" {
			row += " (PREFIXED)"
		}
		listed = append(listed, row)
	}
	var tested []string
	for _, shards := range []int{1, 4} {
		c := aclCase{user: "u", group: "GROUP", leaderTopic: "LEADER", topic: "TOPIC", shards: shards}
		placeholders := strings.NewReplacer("LEADER", "<leaderTopic>", "TOPIC", "<topic>", "GROUP", "<leaderGroupID>")
		for _, need := range c.docsACLs() {
			tested = append(tested, placeholders.Replace(need.acl.String()))
		}
		if shards > 1 {
			tested = append(tested, "ALTER on Topic <leaderTopic>") // see "growing the leader topic"
		}
	}
	slices.Sort(tested)
	tested = slices.Compact(tested)
	slices.Sort(listed)
	if !slices.Equal(listed, tested) {
		t.Fatalf("docs/operations.md lists the ACLs\n\t%s\nthe tests grant\n\t%s", strings.Join(listed, "\n\t"), strings.Join(tested, "\n\t"))
	}
}
