package reaper

import (
	"bytes"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/driver/librdkafka"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/engine/epoch"
	"github.com/goharvest/goharvest/internal/strictyaml"
	"github.com/goharvest/goharvest/outbox"
)

func validConfig() Settings {
	return Settings{
		Config:          goharvest.Config{LeaderTopic: "orders.leader", LeaderGroupID: "orders", Name: "test"},
		BaseKafkaConfig: KafkaConfigMap{"bootstrap.servers": "localhost:9092"},
		DataSource:      "host=localhost dbname=orders",
	}.WithDefaults()
}

// unmarshal reads Settings from YAML as the reaper's file reader does.
func unmarshal(data []byte) (Settings, error) {
	var s Settings
	err := strictyaml.Unmarshal(data, &s)
	return s, err
}

func TestWithDefaults(t *testing.T) {
	got := Settings{}.WithDefaults()
	l := got.Limits
	checks := []struct {
		name      string
		got, want any
	}{
		{"KafkaClient", got.KafkaClient, KafkaClientFranz},
		{"bootstrap.servers", got.BaseKafkaConfig["bootstrap.servers"], DefaultBootstrapServers},
		{"DataSource", got.DataSource, postgres.DefaultDataSource},
		{"ListenDataSource", got.ListenDataSource, postgres.DefaultDataSource},
		{"OutboxTable", got.OutboxTable, outbox.DefaultTable},
		{"LeaderTopic", got.LeaderTopic, goharvest.DefaultLeaderTopicPrefix + got.LeaderGroupID},
		{"Logger", got.Logger, slog.Default()},
		{"IOErrorBackoff", l.IOErrorBackoff, epoch.DefaultIOErrorBackoff},
		{"PollDuration", l.PollDuration, epoch.DefaultPollDuration},
		{"MinPollInterval", l.MinPollInterval, epoch.DefaultMinPollInterval},
		{"HeartbeatTimeout", l.HeartbeatTimeout, epoch.DefaultHeartbeatTimeout},
		{"MaxPollInterval", l.MaxPollInterval, epoch.DefaultHeartbeatTimeout / 2},
		{"QueueTimeout", l.QueueTimeout, epoch.DefaultQueueTimeout},
		{"DrainInterval", l.DrainInterval, epoch.DefaultHeartbeatTimeout / 2},
		{"MarkBackoff", l.MarkBackoff, epoch.DefaultMarkBackoff},
		{"MaxMarkBackoff", l.MaxMarkBackoff, epoch.DefaultMaxMarkBackoff},
		{"MaxInFlightRecords", l.MaxInFlightRecords, epoch.DefaultMaxInFlightRecords},
		{"MaxKeyRun", l.MaxKeyRun, epoch.DefaultMaxKeyRun},
		{"SendConcurrency", l.SendConcurrency, epoch.DefaultSendConcurrency},
		{"SendBuffer", l.SendBuffer, epoch.DefaultSendBuffer},
		{"MarkQueryRecords", l.MarkQueryRecords, epoch.DefaultMarkQueryRecords},
		{"MinMetricsInterval", l.MinMetricsInterval, epoch.DefaultMinMetricsInterval},
		{"HeldCheckInterval", l.HeldCheckInterval, epoch.DefaultHeldCheckInterval},
		{"DeadLetterAttempts (off)", l.DeadLetterAttempts, 0},
		{"DeadLetterAfter (off)", l.DeadLetterAfter, time.Duration(0)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if got.LeaderGroupID == "" || got.Name == "" {
		t.Errorf("LeaderGroupID %q and Name %q must be defaulted", got.LeaderGroupID, got.Name)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("the defaults do not validate: %v", err)
	}
}

func TestWithDefaultsDerivesFromHeartbeatTimeout(t *testing.T) {
	got := goharvest.Limits{HeartbeatTimeout: 2 * time.Second, QueueTimeout: 300 * time.Millisecond}.WithDefaults()
	if got.MaxPollInterval != time.Second {
		t.Errorf("MaxPollInterval = %v, want half the heartbeat timeout", got.MaxPollInterval)
	}
	if got.DrainInterval != 300*time.Millisecond {
		t.Errorf("DrainInterval = %v, want the smaller of MaxPollInterval and QueueTimeout", got.DrainInterval)
	}
}

func TestWithDefaultsLeavesCallerUntouched(t *testing.T) {
	in := Settings{
		Config:              goharvest.Config{LeaderGroupID: "g", LeaderTopic: "t"},
		BaseKafkaConfig:     KafkaConfigMap{"client.id": "x"},
		ProducerKafkaConfig: KafkaConfigMap{"linger.ms": 5},
	}
	out := in.WithDefaults()
	out.BaseKafkaConfig["extra"] = "y"
	out.ProducerKafkaConfig["extra"] = "y"
	if len(in.BaseKafkaConfig) != 1 || len(in.ProducerKafkaConfig) != 1 {
		t.Fatalf("the caller's maps were modified: %v %v", in.BaseKafkaConfig, in.ProducerKafkaConfig)
	}
	if in.DataSource != "" || in.Limits != (goharvest.Limits{}) || in.Logger != nil {
		t.Fatalf("the caller's config was modified: %+v", in)
	}
}

func TestWithDefaultsWarnsAboutDefaultLeaderIDs(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, nil))
	goharvest.Config{Logger: logger}.WithDefaults()
	for _, want := range []string{"level=WARN", "leaderGroupID not set", "leaderTopic not set"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log %q lacks %q", buf.String(), want)
		}
	}

	buf.Reset()
	goharvest.Config{Logger: logger, LeaderGroupID: "g", LeaderTopic: "t"}.WithDefaults()
	if buf.Len() != 0 {
		t.Errorf("warned although both IDs were set: %s", buf.String())
	}
}

func TestValidateAcceptsValidConfig(t *testing.T) {
	for _, client := range []KafkaClient{KafkaClientLibrdkafka, KafkaClientFranz} {
		c := validConfig()
		c.KafkaClient = client
		c.OutboxTable = "app.outbox"
		c.ProducerKafkaConfig = KafkaConfigMap{"compression.type": "lz4", "linger.ms": 5, "batch.size": 1e6, "socket.nagle.disable": true}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", client, err)
		}
	}
}

// KafkaClient chooses the client the reaper makes.
func TestKafkaClientChoosesTheClient(t *testing.T) {
	for client, want := range map[KafkaClient]driver.Kafka{KafkaClientFranz: &franz.Client{}, KafkaClientLibrdkafka: &librdkafka.Client{}} {
		c := validConfig()
		c.KafkaClient = client
		got, problems := c.kafka()
		if len(problems) > 0 || reflect.TypeOf(got) != reflect.TypeOf(want) {
			t.Errorf("%s: %T, %v; want a %T", client, got, problems, want)
		}
	}
}

func TestValidateNamesFieldAndRange(t *testing.T) {
	cases := []struct {
		name   string
		modify func(*Settings)
		want   []string
	}{
		{"librdkafka: owned consumer property", func(c *Settings) {
			c.KafkaClient = KafkaClientLibrdkafka
			c.BaseKafkaConfig["session.timeout.ms"] = 30000
		}, []string{"baseKafkaConfig.session.timeout.ms", "derived from the heartbeat timeout"}},
		{"librdkafka: owned group id", func(c *Settings) {
			c.KafkaClient = KafkaClientLibrdkafka
			c.BaseKafkaConfig["group.id"] = "x"
		}, []string{"baseKafkaConfig.group.id", "leader group ID"}},
		{"librdkafka: idempotence off", func(c *Settings) {
			c.KafkaClient = KafkaClientLibrdkafka
			c.ProducerKafkaConfig["enable.idempotence"] = false
		}, []string{"producerKafkaConfig.enable.idempotence"}},
		{"librdkafka: nested value", func(c *Settings) {
			c.KafkaClient = KafkaClientLibrdkafka
			c.ProducerKafkaConfig["x"] = map[string]any{}
		}, []string{"producerKafkaConfig.x", "string, number or boolean"}},
		{"librdkafka: no bootstrap servers", func(c *Settings) {
			c.KafkaClient = KafkaClientLibrdkafka
			c.BaseKafkaConfig["bootstrap.servers"] = " "
		}, []string{"baseKafkaConfig.bootstrap.servers"}},
		{"franz: nested value", func(c *Settings) { c.ProducerKafkaConfig["linger.ms"] = map[string]any{} },
			[]string{"producerKafkaConfig.linger.ms", "string, number or boolean"}},
		// Each client's refusals of the Kafka properties name the map and key.
		{"unknown client", func(c *Settings) { c.KafkaClient = "rdkafka" },
			[]string{`KafkaClient (kafkaClient): "rdkafka": must be "librdkafka" or "franz"`}},
		{"franz: a property it cannot honour", func(c *Settings) {
			c.KafkaClient = KafkaClientFranz
			c.ProducerKafkaConfig["sticky.partitioning.linger.ms"] = 10
		}, []string{"ProducerKafkaConfig (producerKafkaConfig.sticky.partitioning.linger.ms): the franz client cannot honour this property; remove it, or choose the librdkafka client (kafkaClient: librdkafka)"}},
		{"franz: an owned property", func(c *Settings) {
			c.KafkaClient = KafkaClientFranz
			c.BaseKafkaConfig["session.timeout.ms"] = 30000
		}, []string{"BaseKafkaConfig (baseKafkaConfig.session.timeout.ms): goharvest sets this property itself (derived from the heartbeat timeout"}},
		{"franz: no brokers", func(c *Settings) {
			c.KafkaClient = KafkaClientFranz
			c.BaseKafkaConfig["bootstrap.servers"] = " "
		}, []string{"BaseKafkaConfig (baseKafkaConfig.bootstrap.servers): must name at least one host:port"}},
		{"librdkafka: a transaction shorter than the queue timeout", func(c *Settings) {
			c.KafkaClient = KafkaClientLibrdkafka
			c.ProducerKafkaConfig["transaction.timeout.ms"] = "10000"
		}, []string{"ProducerKafkaConfig (producerKafkaConfig.transaction.timeout.ms): 10s is shorter than the message timeout (30s"}},
		{"franz: a transaction shorter than the queue timeout", func(c *Settings) {
			c.KafkaClient = KafkaClientFranz
			c.ProducerKafkaConfig["transaction.timeout.ms"] = 10000
		}, []string{"ProducerKafkaConfig (producerKafkaConfig.transaction.timeout.ms): 10s is shorter than the message timeout (30s"}},
		{"unknown claim strategy", func(c *Settings) { c.ClaimStrategy = "Read" },
			[]string{"ClaimStrategy (claimStrategy)", `"Read"`, `must be "read" or "mark"`}},
		{"bad leader topic", func(c *Settings) { c.LeaderTopic = "my topic" }, []string{"LeaderTopic (leaderTopic)", `"my topic"`}},
		{"long leader topic", func(c *Settings) { c.LeaderTopic = strings.Repeat("t", 250) }, []string{"leaderTopic", "at most 249"}},
		{"bad group", func(c *Settings) { c.LeaderGroupID = "a/b" }, []string{"LeaderGroupID (leaderGroupID)"}},
		{"bad data source", func(c *Settings) { c.DataSource = "host=x port=notaport" }, []string{"DataSource (dataSource)"}},
		{"bad listen data source", func(c *Settings) { c.ListenDataSource = "host=x port=notaport" }, []string{"ListenDataSource (listenDataSource)"}},
		{"bad table", func(c *Settings) { c.OutboxTable = "outbox; drop table x" }, []string{"OutboxTable (outboxTable)", "not allowed"}},
		{"blank name", func(c *Settings) { c.Name = " " }, []string{"Name (name)"}},
		{"negative backoff", func(c *Settings) { c.Limits.IOErrorBackoff = -time.Second },
			[]string{"Limits.IOErrorBackoff (limits.ioErrorBackoff)", "-1s is out of range [1ms, 10m0s]"}},
		{"heartbeat too short", func(c *Settings) { c.Limits.HeartbeatTimeout = 50 * time.Millisecond },
			[]string{"limits.heartbeatTimeout", "[100ms, 10m0s]"}},
		{"poll slower than half the heartbeat", func(c *Settings) { c.Limits.MaxPollInterval = c.Limits.HeartbeatTimeout/2 + time.Millisecond },
			[]string{"limits.maxPollInterval", "at most half of heartbeatTimeout"}},
		{"min poll too slow", func(c *Settings) {
			c.Limits.MinPollInterval = c.Limits.HeartbeatTimeout / 2
			c.Limits.MaxPollInterval = c.Limits.MinPollInterval
		}, []string{"limits.minPollInterval", "below half of heartbeatTimeout"}},
		{"mark backoff above its max", func(c *Settings) { c.Limits.MarkBackoff = c.Limits.MaxMarkBackoff + time.Millisecond },
			[]string{"limits.markBackoff", "maxMarkBackoff"}},
		{"poll interval below poll duration", func(c *Settings) { c.Limits.PollDuration = 200 * time.Millisecond },
			[]string{"limits.minPollInterval", "at least pollDuration"}},
		{"drain longer than poll", func(c *Settings) { c.Limits.DrainInterval = c.Limits.MaxPollInterval + time.Millisecond },
			[]string{"limits.drainInterval", "maxPollInterval"}},
		{"queue timeout below drain", func(c *Settings) { c.Limits.QueueTimeout = c.Limits.DrainInterval - time.Millisecond },
			[]string{"limits.queueTimeout", "at least drainInterval"}},
		{"in-flight", func(c *Settings) { c.Limits.MaxInFlightRecords = -1 },
			[]string{"Limits.MaxInFlightRecords (limits.maxInFlightRecords): -1 is out of range [1, 1000000]"}},
		{"concurrency", func(c *Settings) { c.Limits.SendConcurrency = 5000 }, []string{"limits.sendConcurrency", "[1, 1024]"}},
		{"buffer", func(c *Settings) { c.Limits.SendBuffer = -3 }, []string{"limits.sendBuffer"}},
		{"key run", func(c *Settings) { c.Limits.MaxKeyRun = 20_000 }, []string{"Limits.MaxKeyRun (limits.maxKeyRun): 20000 is out of range [1, 10000]"}},
		{"mark records", func(c *Settings) { c.Limits.MarkQueryRecords = 1_000_000 }, []string{"limits.markQueryRecords"}},
		{"mark backoff", func(c *Settings) { c.Limits.MaxMarkBackoff = time.Hour }, []string{"limits.maxMarkBackoff"}},
		{"metrics", func(c *Settings) { c.Limits.MinMetricsInterval = -1 }, []string{"limits.minMetricsInterval"}},
		{"held check", func(c *Settings) { c.Limits.HeldCheckInterval = time.Hour }, []string{"Limits.HeldCheckInterval (limits.heldCheckInterval)", "[10ms, 1m0s]"}},
		{"dead-letter attempts", func(c *Settings) { c.Limits.DeadLetterAttempts = -1 }, []string{"Limits.DeadLetterAttempts (limits.deadLetterAttempts): -1 is out of range [0, 1000000]"}},
		{"dead letter too soon", func(c *Settings) { c.Limits.DeadLetterAfter = time.Millisecond },
			[]string{"Limits.DeadLetterAfter (limits.deadLetterAfter)", "or 0 for no dead letters"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.modify(&c)
			err := c.Validate()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestValidateReportsEveryProblem(t *testing.T) {
	c := validConfig()
	c.OutboxTable = "a.b.c"
	c.Limits.SendConcurrency = -1
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "outboxTable") || !strings.Contains(err.Error(), "sendConcurrency") {
		t.Fatalf("want both problems reported, got %v", err)
	}
}

func TestSettingsUnmarshal(t *testing.T) {
	c, err := unmarshal([]byte(`
baseKafkaConfig:
  bootstrap.servers: kafka:9092
producerKafkaConfig:
  compression.type: lz4
  delivery.timeout.ms: 10000
leaderTopic: billing
leaderGroupID: billing
dataSource: host=db dbname=billing
listenDataSource: host=db-direct dbname=billing
kafkaClient: franz
outboxTable: billing.outbox
name: billing-1
limits:
  ioErrorBackoff: 250ms
  pollDuration: 2ms
  minPollInterval: 1s
  maxPollInterval: 2s
  heartbeatTimeout: 5s
  drainInterval: 50ms
  queueTimeout: 10s
  markBackoff: 20ms
  maxMarkBackoff: 200ms
  maxInFlightRecords: 500
  sendConcurrency: 4
  sendBuffer: 20
  markQueryRecords: 200
  minMetricsInterval: 1m
  heldCheckInterval: 500ms
  deadLetterAttempts: 10
  deadLetterAfter: 24h
`))
	if err != nil {
		t.Fatal(err)
	}
	want := goharvest.Limits{
		IOErrorBackoff: 250 * time.Millisecond, PollDuration: 2 * time.Millisecond,
		MinPollInterval: time.Second, MaxPollInterval: 2 * time.Second, HeartbeatTimeout: 5 * time.Second,
		DrainInterval: 50 * time.Millisecond, QueueTimeout: 10 * time.Second, MarkBackoff: 20 * time.Millisecond,
		MaxMarkBackoff:     200 * time.Millisecond,
		MaxInFlightRecords: 500, SendConcurrency: 4, SendBuffer: 20, MarkQueryRecords: 200,
		MinMetricsInterval: time.Minute,
		HeldCheckInterval:  500 * time.Millisecond, DeadLetterAttempts: 10, DeadLetterAfter: 24 * time.Hour,
	}
	if c.Limits != want {
		t.Errorf("limits = %+v\nwant     %+v", c.Limits, want)
	}
	if c.BaseKafkaConfig["bootstrap.servers"] != "kafka:9092" || c.ProducerKafkaConfig["delivery.timeout.ms"] != 10000 ||
		c.LeaderTopic != "billing" || c.LeaderGroupID != "billing" || c.DataSource != "host=db dbname=billing" ||
		c.ListenDataSource != "host=db-direct dbname=billing" ||
		c.OutboxTable != "billing.outbox" || c.Name != "billing-1" || c.KafkaClient != KafkaClientFranz {
		t.Errorf("decoded %+v", c)
	}
	if err := c.WithDefaults().Validate(); err != nil {
		t.Error(err)
	}
}

func TestSettingsUnmarshalRejectsUnknownAndMalformed(t *testing.T) {
	cases := map[string]string{
		"outboxTabel: x\n":                        `line 1: unknown key "outboxTabel"`,
		"limits:\n  heartbeatTimout: 5s\n":        `line 2: unknown key "limits.heartbeatTimout"`,
		"limits:\n  heartbeatTimeout: 5\n":        "line 2: limits.heartbeatTimeout:",
		"limits:\n  maxInFlightRecords: lots\n":   "line 2: limits.maxInFlightRecords:",
		"name: a\nlimits:\n  queueTimeout: 10x\n": "line 3: limits.queueTimeout:",
	}
	for doc, want := range cases {
		_, err := unmarshal([]byte(doc))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("unmarshal(%q) error = %v, want one containing %q", doc, err, want)
		}
	}
}
