// Package kafkacluster runs Apache Kafka for tests: 1 or 3 KRaft nodes (each both broker and
// controller) from the broker's jars on Maven Central (see Jars), on loopback ports that were free
// when they started, in a temporary directory. It waits until the cluster serves transactions and
// consumer groups, and stops every node by PID. A node's log is kept when a test fails.
//
// The brokers run with Kafka's production defaults except where a test cannot: each exception is
// in testDefaults with its reason, and a test may add its own (BrokerConfig), saying why.
//
// A package whose tests share one cluster calls Run from TestMain and Shared from its tests:
//
//	func TestMain(m *testing.M) { os.Exit(kafkacluster.Run(m)) }
//
// A test that restarts or freezes brokers starts a cluster of its own with Start, as does one that
// needs TLS or SASL with ACLs (TLS, Secure; see security.go).
package kafkacluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// testDefaults are the broker settings in which every test cluster departs from Kafka's
// defaults, each for the reason beside it. Replication settings are set from the node count in
// properties.
var testDefaults = map[string]struct{ value, why string }{
	"group.initial.rebalance.delay.ms": {"0",
		"Kafka delays the first rebalance of an empty group by 3s to gather its members; the tests form hundreds of new groups"},
	"group.min.session.timeout.ms": {"500",
		"the tests elect leaders with a 1s heartbeat timeout (a 2s session) so that takeovers take seconds; Kafka's minimum is 6s"},
	"offsets.topic.num.partitions": {"5",
		"50 partitions of __consumer_offsets, each loaded by its coordinator at start, take seconds on two cores"},
	"transaction.state.log.num.partitions": {"5",
		"as offsets.topic.num.partitions, for __transaction_state"},
	"log.segment.bytes": {strconv.Itoa(16 << 20),
		"Kafka preallocates nothing, but each segment's index is 10 MiB of mapped memory per partition; 16 MiB segments keep a test cluster small"},
}

// Option adjusts a cluster before it starts.
type Option func(*options)

type options struct {
	nodes         int
	version       string
	config        map[string]string
	proxied       bool
	groupDefaults bool
	features      map[string]int // with Feature: finalized at format, over the version's defaults
	security      security       // see security.go
}

// GroupDefaults keeps Kafka's own group timings (a 6s minimum session, a first rebalance held
// 3s), which testDefaults shortens, for tests that measure what a user of a default broker sees.
func GroupDefaults() Option { return func(o *options) { o.groupDefaults = true } }

// Nodes sets how many nodes the cluster has: 1 (the default) or 3. A 3-node cluster replicates
// every topic 3 times, internal ones included, with min.insync.replicas 2, as production does.
func Nodes(n int) Option { return func(o *options) { o.nodes = n } }

// BrokerConfig sets broker properties on every node, over the defaults. Say why at the call.
func BrokerConfig(props map[string]string) Option {
	return func(o *options) { maps.Copy(o.config, props) }
}

// Feature formats the cluster with feature name finalized at level instead of the Kafka
// version's default (kafka-storage format --feature name=level), as a cluster upgraded from an
// older version may run: Feature("transaction.version", 1) gives Kafka 4.x transactions without
// KIP-890 part 2. Kafka refuses a level its version does not know.
func Feature(name string, level int) Option {
	return func(o *options) {
		if o.features == nil {
			o.features = map[string]int{}
		}
		o.features[name] = level
	}
}

// Cluster is a running Kafka cluster.
type Cluster struct {
	Version string
	dir     string
	jars    string
	nodes   []*Node
	proxies []*proxy // with Proxied, one per node
	sec     *secured // nil for a plaintext cluster; see security.go
}

// Node is one KRaft node, broker and controller at once.
type Node struct {
	ID             int
	Port           int // the client listener's
	internalPort   int // the listener of brokers and the fixture's own clients: Port on a plaintext cluster
	controllerPort int
	proxiedPort    int // with Proxied: the PROXIED listener's
	proxyPort      int // and the proxy's in front of it, which the listener advertises
	dir            string
	jars           string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has exited
	frozen bool
}

// New starts a cluster and waits until it serves transactions and groups. Close stops it.
func New(opts ...Option) (*Cluster, error) {
	o := options{nodes: 1, version: Version(), config: map[string]string{}}
	for _, opt := range opts {
		opt(&o)
	}
	if o.nodes != 1 && o.nodes != 3 {
		return nil, fmt.Errorf("kafkacluster: %d nodes: only 1 or 3", o.nodes)
	}
	jars, err := Jars(o.version)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "goharvest-kafka-")
	if err != nil {
		return nil, fmt.Errorf("kafkacluster: %w", err)
	}
	c := &Cluster{Version: o.version, dir: dir, jars: jars}
	// Each node has a client listener and a controller listener; a secured cluster's brokers talk
	// to each other on a listener of their own (see security.go), and a proxied cluster's nodes
	// have a listener behind a proxy (see proxy.go).
	perNode := 4
	ports, err := freePorts(perNode * o.nodes)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	for i := range o.nodes {
		p := ports[perNode*i : perNode*(i+1)]
		n := &Node{ID: i + 1, Port: p[0], internalPort: p[0], controllerPort: p[1],
			dir: filepath.Join(dir, fmt.Sprintf("node-%d", i+1)), jars: jars}
		if o.security != plaintext {
			n.internalPort = p[2]
		}
		if o.proxied {
			n.proxiedPort, n.proxyPort = p[2], p[3]
			proxy, err := startProxy(n.proxyPort, net.JoinHostPort("127.0.0.1", strconv.Itoa(n.proxiedPort)))
			if err != nil {
				c.Close(false)
				return nil, err
			}
			c.proxies = append(c.proxies, proxy)
		}
		c.nodes = append(c.nodes, n)
	}
	if o.security != plaintext {
		if o.proxied {
			os.RemoveAll(dir)
			return nil, errors.New("kafkacluster: a proxied cluster is plaintext only")
		}
		if c.sec, err = newSecured(dir, o.security); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := c.format(o); err != nil {
		c.Close(true)
		return nil, err
	}
	for _, n := range c.nodes {
		if err := n.Start(); err != nil {
			c.Close(true)
			return nil, err
		}
	}
	if err := c.WaitReady(2 * time.Minute); err != nil {
		c.Close(true)
		return nil, err
	}
	return c, nil
}

// Start starts a cluster for one test, stopped when the test ends; its logs are kept if the test
// failed.
func Start(tb testing.TB, opts ...Option) *Cluster {
	tb.Helper()
	c, err := New(opts...)
	if err != nil {
		tb.Fatalf("kafkacluster: %v", err)
	}
	// GOHARVEST_KAFKA_KEEP_LOGS keeps the logs of a test that passed too, to trace its timings.
	tb.Cleanup(func() { c.Close(tb.Failed() || os.Getenv("GOHARVEST_KAFKA_KEEP_LOGS") != "") })
	return c
}

// Addr returns the bootstrap servers: every node's client listener, comma-separated.
func (c *Cluster) Addr() string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return strings.Join(addrs, ",")
}

// internalAddr returns the bootstrap servers of the fixture's own clients (the readiness probe,
// topics, ACLs): the client listener of a plaintext cluster, the brokers' own of a secured one,
// where whatever is under test (ACLs, users) cannot get in their way.
func (c *Cluster) internalAddr() string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = net.JoinHostPort("127.0.0.1", strconv.Itoa(n.internalPort))
	}
	return strings.Join(addrs, ",")
}

// Nodes returns the cluster's nodes, in node ID order.
func (c *Cluster) Nodes() []*Node { return c.nodes }

// Addr is the node's client listener, host:port.
func (n *Node) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.Port)) }

// LogPath is the file the node's output goes to.
func (n *Node) LogPath() string { return filepath.Join(n.dir, "server.log") }

// Close stops every node at once (SIGKILL: the data is thrown away). With keepLogs, the nodes'
// directories stay, and their path is printed, for a failed test to be read.
func (c *Cluster) Close(keepLogs bool) {
	for _, n := range c.nodes {
		n.Kill()
	}
	for _, p := range c.proxies {
		p.close()
	}
	if keepLogs {
		fmt.Fprintf(os.Stderr, "kafkacluster: Kafka %s logs kept in %s\n", c.Version, c.dir)
		return
	}
	os.RemoveAll(c.dir)
}

// properties returns node n's server.properties.
func (c *Cluster) properties(n *Node, o options) map[string]string {
	voters := make([]string, len(c.nodes))
	for i, m := range c.nodes {
		voters[i] = fmt.Sprintf("%d@127.0.0.1:%d", m.ID, m.controllerPort)
	}
	p := map[string]string{
		"process.roles":                  "broker,controller",
		"node.id":                        strconv.Itoa(n.ID),
		"controller.quorum.voters":       strings.Join(voters, ","),
		"listeners":                      fmt.Sprintf("PLAINTEXT://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d", n.Port, n.controllerPort),
		"advertised.listeners":           fmt.Sprintf("PLAINTEXT://127.0.0.1:%d", n.Port),
		"controller.listener.names":      "CONTROLLER",
		"inter.broker.listener.name":     "PLAINTEXT",
		"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
		"log.dirs":                       filepath.Join(n.dir, "data"),
	}
	for k, d := range testDefaults {
		if o.groupDefaults && strings.HasPrefix(k, "group.") {
			continue
		}
		p[k] = d.value
	}
	if len(c.nodes) == 1 {
		// A single node can hold one replica of anything; Kafka's defaults for its internal
		// topics ask for 3 and would leave transactions and groups unavailable.
		maps.Copy(p, map[string]string{
			"offsets.topic.replication.factor":                 "1",
			"transaction.state.log.replication.factor":         "1",
			"transaction.state.log.min.isr":                    "1",
			"share.coordinator.state.topic.replication.factor": "1",
			"share.coordinator.state.topic.min.isr":            "1",
		})
	} else {
		// As production runs three brokers: every topic on all three, and a write acknowledged
		// once two have it (the internal topics' defaults are already 3 and 2).
		maps.Copy(p, map[string]string{
			"offsets.topic.replication.factor": "3",
			"default.replication.factor":       "3",
			"min.insync.replicas":              "2",
		})
	}
	if o.proxied {
		p["listeners"] += fmt.Sprintf(",PROXIED://127.0.0.1:%d", n.proxiedPort)
		p["advertised.listeners"] += fmt.Sprintf(",PROXIED://127.0.0.1:%d", n.proxyPort)
		p["listener.security.protocol.map"] += ",PROXIED:PLAINTEXT"
	}
	if c.sec != nil {
		c.sec.properties(n, p)
	}
	maps.Copy(p, o.config)
	return p
}

// format writes each node's configuration and formats its storage for one new cluster ID.
func (c *Cluster) format(o options) error {
	id, err := c.java(30*time.Second, "kafka.tools.StorageTool", "random-uuid")
	if err != nil {
		return fmt.Errorf("kafkacluster: cluster ID: %w", err)
	}
	clusterID := strings.TrimSpace(lastLine(id))
	for _, n := range c.nodes {
		if err := os.MkdirAll(n.dir, 0o755); err != nil {
			return fmt.Errorf("kafkacluster: %w", err)
		}
		props := c.properties(n, o)
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(props)) {
			fmt.Fprintf(&b, "%s=%s\n", k, props[k])
		}
		if err := os.WriteFile(filepath.Join(n.dir, "server.properties"), []byte(b.String()), 0o644); err != nil {
			return fmt.Errorf("kafkacluster: %w", err)
		}
		if err := os.WriteFile(filepath.Join(n.dir, "log4j2.properties"), []byte(log4jConfig), 0o644); err != nil {
			return fmt.Errorf("kafkacluster: %w", err)
		}
		args := []string{"format", "--cluster-id", clusterID, "--config", filepath.Join(n.dir, "server.properties")}
		if c.sec != nil {
			args = append(args, c.sec.formatArgs()...)
		}
		for _, name := range slices.Sorted(maps.Keys(o.features)) {
			args = append(args, "--feature", fmt.Sprintf("%s=%d", name, o.features[name]))
		}
		if out, err := c.java(time.Minute, "kafka.tools.StorageTool", args...); err != nil {
			return fmt.Errorf("kafkacluster: format node %d: %w\n%s", n.ID, err, out)
		}
	}
	return nil
}

// log4jConfig sends the broker's log to its output, which Start writes to server.log. Kafka
// prints every configuration it parses at INFO; those lines are left out.
const log4jConfig = `rootLogger.level=INFO
rootLogger.appenderRef.out.ref=out
appender.out.type=Console
appender.out.name=out
appender.out.layout.type=PatternLayout
appender.out.layout.pattern=[%d] %p %m (%c)%n
logger.config.name=org.apache.kafka.common.config.AbstractConfig
logger.config.level=WARN
`

// java runs a Kafka tool's main class to completion and returns its output.
func (c *Cluster) java(timeout time.Duration, class string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "java", append([]string{"-cp", filepath.Join(c.jars, "*"), class}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// jvmOptions size each broker for a test machine of two cores: a bounded heap, and G1 with short
// pauses (Kafka's own scripts choose G1 with a 20ms goal too).
var jvmOptions = []string{"-Xms256m", "-Xmx1g", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
	"-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true"}

// WaitReady waits until every running node is in the cluster's metadata and a transaction that
// produces a record and commits a group offset (as every harvester transaction does) commits:
// by then the coordinators of transactions and groups have their topics and leaders.
func (c *Cluster) WaitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = c.exited(); err != nil {
			return err
		}
		if err = c.probe(time.Until(deadline)); err == nil {
			return nil
		}
		time.Sleep(250 * time.Millisecond)
	}
	return fmt.Errorf("kafkacluster: not ready after %v (logs in %s): %w", timeout, c.dir, err)
}

// exited fails when a node that should run has exited, with the end of its log.
func (c *Cluster) exited() error {
	for _, n := range c.nodes {
		n.mu.Lock()
		exited := n.exited
		running := n.cmd != nil
		n.mu.Unlock()
		if !running {
			continue
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(n.LogPath())
			tail := string(log)
			if len(tail) > 4000 {
				tail = tail[len(tail)-4000:]
			}
			return fmt.Errorf("kafkacluster: node %d exited:\n%s", n.ID, tail)
		default:
		}
	}
	return nil
}

// probe runs one round of the readiness check.
func (c *Cluster) probe(budget time.Duration) error {
	budget = min(budget, 30*time.Second)
	var running int
	for _, n := range c.nodes {
		if n.Running() {
			running++
		}
	}
	base := kafka.ConfigMap{"bootstrap.servers": c.internalAddr(), "log_level": 0}
	admin, err := kafka.NewAdminClient(&base)
	if err != nil {
		return err
	}
	md, err := admin.GetMetadata(nil, true, int(min(budget, 5*time.Second).Milliseconds()))
	admin.Close()
	if err != nil {
		return err
	}
	if len(md.Brokers) < running {
		return fmt.Errorf("%d of %d brokers registered", len(md.Brokers), running)
	}
	// A short transaction timeout, so that the probe suits a broker whose transaction.max.timeout.ms
	// a test lowered.
	// The probe's topic is created, not left to the broker: a cluster may create no topics on
	// demand, and then a transaction's offsets for a missing topic fail.
	if err := c.CreateTopic(probeTopic, 1); err != nil {
		return err
	}
	pc := kafka.ConfigMap{"bootstrap.servers": c.internalAddr(), "transactional.id": "kafkacluster.probe", "transaction.timeout.ms": 1000,
		"log_level": 0, "go.delivery.reports": false}
	p, err := kafka.NewProducer(&pc)
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	if err := p.InitTransactions(ctx); err != nil {
		return fmt.Errorf("init transactions: %w", err)
	}
	if err := p.BeginTransaction(); err != nil {
		return err
	}
	topic := probeTopic
	if err := p.Produce(&kafka.Message{TopicPartition: kafka.TopicPartition{Topic: &topic, Partition: kafka.PartitionAny},
		Value: []byte("ready?")}, nil); err != nil {
		return err
	}
	group, err := kafka.NewTestConsumerGroupMetadata("kafkacluster.probe")
	if err != nil {
		return err
	}
	if err := p.SendOffsetsToTransaction(ctx, []kafka.TopicPartition{{Topic: &topic, Partition: 0, Offset: 0}}, group); err != nil {
		p.AbortTransaction(ctx)
		return fmt.Errorf("offsets in a transaction: %w", err)
	}
	if err := p.CommitTransaction(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if c.sec != nil {
		return c.sec.probe(c, budget)
	}
	return nil
}

// probeTopic is the topic WaitReady's transactions write to.
const probeTopic = "kafkacluster.probe"

// CreateTopic creates a topic with the broker's default replication and waits until every
// partition has a leader.
func (c *Cluster) CreateTopic(name string, partitions int) error {
	return c.createTopic(kafka.TopicSpecification{Topic: name, NumPartitions: partitions, ReplicationFactor: -1}, allLed)
}

// createTopic creates spec's topic, unless it exists, and waits until its metadata shows all its
// partitions and ready accepts them.
func (c *Cluster) createTopic(spec kafka.TopicSpecification, ready func([]kafka.PartitionMetadata) bool) error {
	name := spec.Topic
	cm := kafka.ConfigMap{"bootstrap.servers": c.internalAddr(), "log_level": 0}
	admin, err := kafka.NewAdminClient(&cm)
	if err != nil {
		return err
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := admin.CreateTopics(ctx, []kafka.TopicSpecification{spec})
	if err != nil {
		return fmt.Errorf("kafkacluster: create topic %s: %w", name, err)
	}
	for _, r := range res {
		if code := r.Error.Code(); code != kafka.ErrNoError && code != kafka.ErrTopicAlreadyExists {
			return fmt.Errorf("kafkacluster: create topic %s: %w", name, r.Error)
		}
	}
	for ctx.Err() == nil {
		md, err := admin.GetMetadata(&name, false, 5000)
		if err == nil {
			if t, ok := md.Topics[name]; ok && len(t.Partitions) == spec.NumPartitions && ready(t.Partitions) {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond) // the controller electing the new partitions' leaders
	}
	return fmt.Errorf("kafkacluster: topic %s: partitions not led as wanted after 30s", name)
}

func allLed(ps []kafka.PartitionMetadata) bool {
	for _, p := range ps {
		if p.Leader < 0 || p.Error.Code() != kafka.ErrNoError {
			return false
		}
	}
	return true
}

// freePorts returns n loopback ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("kafkacluster: free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Topic creates topic name with partitions partitions for a test (see CreateTopic), failing the
// test if it cannot, and returns the name.
func (c *Cluster) Topic(tb testing.TB, name string, partitions int) string {
	tb.Helper()
	if err := c.CreateTopic(name, partitions); err != nil {
		tb.Fatal(err)
	}
	return name
}

// Coordinator kinds, for Coordinator.
const (
	GroupCoordinator       = int8(0)
	TransactionCoordinator = int8(1)
)

// Coordinator returns the node that coordinates a consumer group or a transactional ID (kind
// GroupCoordinator or TransactionCoordinator): the leader of the partition of __consumer_offsets
// or __transaction_state that the key hashes to.
func (c *Cluster) Coordinator(kind int8, key string) (*Node, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(strings.Split(c.internalAddr(), ",")...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		req := kmsg.NewPtrFindCoordinatorRequest()
		req.CoordinatorType, req.CoordinatorKeys = kind, []string{key}
		resp, err := req.RequestWith(ctx, cl)
		if err == nil && len(resp.Coordinators) == 1 && resp.Coordinators[0].ErrorCode == 0 {
			for _, n := range c.nodes {
				if int32(n.ID) == resp.Coordinators[0].NodeID {
					return n, nil
				}
			}
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("kafkacluster: coordinator of %q: %v", key, errors.Join(err, ctx.Err()))
		}
		time.Sleep(100 * time.Millisecond) // a coordinator moving after a failure
	}
}
