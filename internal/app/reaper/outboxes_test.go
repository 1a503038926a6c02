package reaper

import (
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest"
)

// Each entry of outboxes: is merged over harvest: key by key, and what an outbox must have of
// its own is derived from its name when left out.
func TestLoadMergesOutboxesOverHarvest(t *testing.T) {
	f, err := Load([]byte(`harvest:
  name: pod-1
  baseKafkaConfig:
    bootstrap.servers: ${BROKERS}
    client.id: shared
  producerKafkaConfig:
    compression.type: lz4
  limits:
    heartbeatTimeout: 2s
    deadLetterAttempts: 5
outboxes:
  - outbox: billing
    dataSource: host=db1 dbname=billing password=${PGPASSWORD}
  - outbox: orders
    dataSource: host=db1 dbname=billing
    outboxTable: orders.outbox
    shards: 4
    producerKafkaConfig:
      linger.ms: 5
    limits:
      deadLetterAttempts: 0
  - outbox: tenant-7
    dataSource: host=db2 dbname=tenant7
    leaderGroupID: t7
    name: t7-harvester
    claimStrategy: mark
`), env(map[string]string{"BROKERS": "k:9092", "PGPASSWORD": "pw"}))
	if err != nil {
		t.Fatal(err)
	}
	if !f.listed || len(f.Outboxes) != 3 {
		t.Fatalf("listed %v, %d outboxes", f.listed, len(f.Outboxes))
	}
	billing, orders, tenant := f.Outboxes[0].Harvest, f.Outboxes[1].Harvest, f.Outboxes[2].Harvest
	if f.Outboxes[0].Name != "billing" || f.Outboxes[0].Line != 12 || f.Outboxes[2].Line != 22 {
		t.Errorf("names and lines %+v", f.Outboxes)
	}
	if billing.DataSource != "host=db1 dbname=billing password=pw" || billing.BaseKafkaConfig["bootstrap.servers"] != "k:9092" ||
		billing.BaseKafkaConfig["client.id"] != "shared" || billing.Limits.HeartbeatTimeout != 2*time.Second || billing.Limits.DeadLetterAttempts != 5 {
		t.Errorf("billing did not take the shared settings: %+v", billing)
	}
	if billing.LeaderGroupID != "billing" || billing.LeaderTopic != goharvest.DefaultLeaderTopicPrefix+"billing" || billing.Name != "pod-1.billing" {
		t.Errorf("billing's derived group %q, topic %q, name %q", billing.LeaderGroupID, billing.LeaderTopic, billing.Name)
	}
	// A map merges key by key: linger.ms added, compression.type kept; a limit set to 0 overrides.
	if orders.ProducerKafkaConfig["linger.ms"] != 5 || orders.ProducerKafkaConfig["compression.type"] != "lz4" ||
		orders.Limits.DeadLetterAttempts != 0 || orders.Limits.HeartbeatTimeout != 2*time.Second || orders.Shards != 4 {
		t.Errorf("orders' overrides: %+v", orders)
	}
	if tenant.LeaderGroupID != "t7" || tenant.LeaderTopic != goharvest.DefaultLeaderTopicPrefix+"t7" || tenant.Name != "t7-harvester" || tenant.ClaimStrategy != goharvest.ClaimMark {
		t.Errorf("tenant-7's own settings: %+v", tenant)
	}
	if billing.ProducerKafkaConfig["linger.ms"] != nil {
		t.Errorf("orders' override reached billing: %v", billing.ProducerKafkaConfig)
	}
	for _, o := range f.Outboxes {
		h := o.Harvest
		if err := h.WithDefaults().Validate(); err != nil {
			t.Errorf("%s: %v", o.Name, err)
		}
	}
}

// A harvest:-only file has one outbox, named after its table, and its metrics and logs carry no
// outbox label of the reaper's, as before outboxes: existed.
func TestLoadHarvestAloneIsOneOutbox(t *testing.T) {
	for doc, want := range map[string]string{
		"harvest:\n  leaderGroupID: g\n":                         "outbox",
		"harvest:\n  leaderGroupID: g\n  outboxTable: app.box\n": "app.box",
		"logging:\n  level: warn\n":                              "outbox",
	} {
		f, err := Load([]byte(doc), env(nil))
		if err != nil {
			t.Fatal(err)
		}
		if f.listed || len(f.Outboxes) != 1 || f.Outboxes[0].Name != want || f.Outboxes[0].Harvest.LeaderGroupID != f.Harvest.LeaderGroupID {
			t.Errorf("%q: listed %v, outboxes %+v; want one named %q", doc, f.listed, f.Outboxes, want)
		}
	}
}

// Every refusal names the outbox and its line, and the outbox it collides with.
func TestLoadRefusesOutboxesThatShare(t *testing.T) {
	const head = "harvest:\n  name: pod\noutboxes:\n"
	cases := map[string]struct{ entries, want string }{
		"a name": {
			"  - outbox: a\n    dataSource: dbname=x\n  - outbox: a\n    dataSource: dbname=y\n",
			`line 6: outbox "a": its name a is also that of outbox "a" (line 4); each outbox needs its own`},
		"a group": {
			"  - outbox: a\n    dataSource: dbname=x\n    leaderGroupID: g\n  - outbox: b\n    dataSource: dbname=y\n    leaderGroupID: g\n    leaderTopic: b.leader\n",
			`line 7: outbox "b": its leaderGroupID g is also that of outbox "a" (line 4)`},
		"a leader topic": {
			"  - outbox: a\n    dataSource: dbname=x\n    leaderTopic: t\n  - outbox: b\n    dataSource: dbname=y\n    leaderTopic: t\n",
			`line 7: outbox "b": its leaderTopic t is also that of outbox "a" (line 4)`},
		"a table, written two ways": {
			"  - outbox: a\n    dataSource: host=db port=5432 dbname=x\n  - outbox: b\n    dataSource: postgres://db/x\n    outboxTable: public.outbox\n",
			`line 6: outbox "b": its table public.outbox in database x on db:5432 is also that of outbox "a" (line 4)`},
		"a harvester name": {
			"  - outbox: a\n    dataSource: dbname=x\n    name: h\n  - outbox: b\n    dataSource: dbname=y\n    name: h\n",
			`line 7: outbox "b": its harvester name (name) h is also that of outbox "a" (line 4)`},
		"no name": {
			"  - dataSource: dbname=x\n",
			`line 4: outboxes: entry's outbox (its name): "": empty`},
		"a name Kafka refuses": {
			"  - outbox: a/b\n",
			`line 4: outboxes: entry's outbox (its name): "a/b": use only letters`},
		"none": {
			"  []\n",
			"line 4: outboxes: lists no outbox",
		},
		"an unknown key": {
			"  - outbox: a\n    dataSorce: x\n",
			`line 5: unknown key "outboxes.dataSorce"`},
		"an unset variable": {
			"  - outbox: a\n    dataSource: password=${PGPASSWORD}\n",
			"line 5: outboxes[a].dataSource: environment variable PGPASSWORD is not set"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			doc := head + c.entries
			_, err := Load([]byte(doc), env(nil))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Load error = %v\nwant one containing %q\nin:\n%s", err, c.want, doc)
			}
		})
	}
}

// A group set under harvest: is every outbox's, which two outboxes may not share.
func TestLoadRefusesAGroupSharedUnderHarvest(t *testing.T) {
	_, err := Load([]byte("harvest:\n  leaderGroupID: shared\noutboxes:\n  - outbox: a\n    dataSource: dbname=x\n  - outbox: b\n    dataSource: dbname=y\n"), env(nil))
	const want = `line 6: outbox "b": its leaderGroupID shared is also that of outbox "a" (line 4)`
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Load error = %v, want one containing %q", err, want)
	}
}

// The commands that concern one outbox need -outbox when the file lists several, and say which
// there are.
func TestCommandsNeedOutboxWhenThereAreSeveral(t *testing.T) {
	const config = "outboxes:\n  - outbox: a\n    dataSource: dbname=x\n  - outbox: b\n    dataSource: dbname=y\n"
	for _, args := range [][]string{{"held"}, {"dead-letter", "5"}, {"requeue", "5"}, {"rules"}} {
		code, _, stderr := run(t, config, args...)
		if code != ExitUsage || !strings.Contains(stderr, "the file lists 2 outboxes; name one with -outbox: a, b") {
			t.Errorf("%v: exit %d, %q", args, code, stderr)
		}
	}
	code, _, stderr := run(t, config, "held", "-outbox", "c")
	if code != ExitUsage || !strings.Contains(stderr, `-outbox "c": the file lists no such outbox; it lists a, b`) {
		t.Errorf("held -outbox c: exit %d, %q", code, stderr)
	}
	code, stdout, stderr := run(t, config, "rules", "-outbox", "b")
	if code != ExitOK || !strings.Contains(stdout, "groups:") {
		t.Errorf("rules -outbox b: exit %d, %q %q", code, stdout, stderr)
	}
}
