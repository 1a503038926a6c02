package reaper_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/buildtest"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
)

// A reaper built with CGO_ENABLED=0 has the franz client only: it uses it unless told otherwise,
// and refuses kafkaClient: librdkafka, or an unknown client, with one line naming the key and the
// way out, before it contacts anything.
func TestReaperWithoutCgoChoosesFranz(t *testing.T) {
	bin := buildtest.BinaryWithoutCgo(t, "github.com/goharvest/goharvest/cmd/reaper")
	config := func(client string) string {
		path := filepath.Join(t.TempDir(), "reaper.yaml")
		yaml := "harvest:\n  baseKafkaConfig:\n    bootstrap.servers: 127.0.0.1:1\n  leaderGroupID: nocgo\n  leaderTopic: nocgo.leader\n" +
			"  dataSource: host=127.0.0.1 port=1 dbname=none connect_timeout=1\n"
		if client != "" {
			yaml += "  kafkaClient: " + client + "\n"
		}
		yaml += "logging:\n  format: json\n"
		if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	for client, want := range map[string]string{
		"librdkafka": `KafkaClient (kafkaClient): "librdkafka" needs cgo, and this program was built without it; choose "franz", or build with cgo (CGO_ENABLED=1 and gcc)`,
		"rdkafka":    `KafkaClient (kafkaClient): "rdkafka": must be "librdkafka" or "franz"`,
	} {
		p := startReaper(t, bin, nil, "-f", config(client))
		<-p.done
		out := p.stderr.String()
		if code := p.cmd.ProcessState.ExitCode(); code != 2 || strings.Count(out, "\n") != 1 || !strings.Contains(out, want) {
			t.Errorf("kafkaClient: %s: exit %d, output %q; want exit 2 and one line with %q", client, code, out, want)
		}
	}

	// Unset, the client is franz's: the reaper says so as it starts. (What follows fails on the
	// unreachable database and broker.)
	p := startReaper(t, bin, nil, "-f", config(""))
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.stop(t)
	}
	if out := p.stderr.String(); !strings.Contains(out, `"msg":"reaper starting"`) || !strings.Contains(out, `"kafkaClient":"franz"`) {
		t.Errorf("the reaper built without cgo did not start with the franz client:\n%s", out)
	}
}

// A reaper built without cgo publishes the outbox to Apache Kafka with the franz client, every
// record in its key's order.
func TestReaperWithoutCgoPublishes(t *testing.T) {
	bin := buildtest.BinaryWithoutCgo(t, "github.com/goharvest/goharvest/cmd/reaper")
	dsn := pgtest.NewDatabase(t)
	broker := kafkacluster.Shared(t)
	topic := broker.Topic(t, "nocgo.events", 4)
	config := writeConfig(t, broker, "reaper-nocgo", "  producerKafkaConfig:\n    compression.type: lz4\n")
	env := []string{"DATABASE_URL=" + dsn}
	initOutbox(t, bin, env, config)
	const keys, perKey = 50, 20
	_, expected, v := stashBacklog(t, dsn, broker, topic, keys, perKey)

	r := startReaper(t, bin, env, "-f", config)
	for deadline := time.Now().Add(2 * time.Minute); v.Distinct() < keys*perKey; {
		select {
		case <-r.done:
			t.Fatalf("the reaper exited %d having published %d of %d records:\n%s", r.cmd.ProcessState.ExitCode(), v.Distinct(), keys*perKey, r.stderr)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.stop(t)
			t.Fatalf("%d of %d records published within 2m:\n%s", v.Distinct(), keys*perKey, r.stderr)
		}
	}
	if code := r.stop(t); code != 0 {
		t.Fatalf("the reaper exited %d after SIGTERM:\n%s", code, r.stderr)
	}
	if report := v.Report(expected); !report.OK() {
		t.Fatalf("delivery check failed:\n%s", report)
	}
	if out := r.stderr.String(); !strings.Contains(out, `"kafkaClient":"franz"`) || !strings.Contains(out, `"msg":"leader acquired"`) {
		t.Errorf("the reaper's log lacks the franz client or the leader acquired line:\n%s", out)
	}
}
