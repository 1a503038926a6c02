package franz

// goharvest.Config holds its Kafka settings as librdkafka names them (BaseKafkaConfig and
// ProducerKafkaConfig, baseKafkaConfig and producerKafkaConfig in the reaper's YAML), whichever
// client reads them. FromProperties makes this client's Config from them: each property it knows
// becomes the kgo option or Config field that does the same, and every other property is a
// Problem, so that choosing this client never drops a setting silently.
//
// The properties fall into three scopes. The connection (brokers, TLS, SASL) is the same for the
// producers and the election, so it comes from the base map alone, into SeedBrokers and Opts. A
// setting of any kgo client (dial timeout, backoff, metadata age) from the base map reaches every
// client (Opts), and from the producer map the producers (ProducerOpts). A producer's setting
// (linger, compression, timeouts) comes from either map, the producer map's overriding the base
// map's, as librdkafka's producer reads them.

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/internal/kafkaprops"
)

// Problem is a property FromProperties refuses: one it cannot honour, one goharvest owns, or a
// value it cannot use.
type Problem struct {
	// Producer is true for a property of the producer map, false for one of the base map.
	Producer bool
	Property string
	Reason   string
}

// FromProperties returns the Config that does what librdkafka would do with the properties base
// (goharvest.Config.BaseKafkaConfig) and producer (ProducerKafkaConfig), and every property it
// refuses; the Config is complete only when there are none. deliveryTimeout is the harvester's
// (Limits.QueueTimeout, driver.ProducerConfig's), which a transaction.timeout.ms must not be
// shorter than, as librdkafka requires. Files that properties name (ssl.ca.location and the like)
// are read now, and a file that cannot be read or parsed is a Problem of its property.
func FromProperties(base, producer map[string]any, deliveryTimeout time.Duration) (Config, []Problem) {
	var r reading
	shared, own := r.read(base, false), r.read(producer, true)
	merged := maps.Clone(shared)
	maps.Copy(merged, own)

	c := Config{SeedBrokers: r.seedBrokers(shared)}
	c.Opts = append(r.security(shared), r.clientOpts(shared)...)
	if id, ok := get[string](shared, "client.id"); ok {
		c.Opts = append(c.Opts, kgo.ClientID(id)) // the producers' is ClientID (see below)
	}
	if setsAny(own, everyClient) {
		c.ProducerOpts = r.clientOpts(merged)
	}
	c.ProducerOpts = append(c.ProducerOpts, r.producingOpts(merged)...)

	// As in librdkafka's producer, only the producer map's client.id names the producers: the
	// harvester's name (driver.ProducerConfig.ClientID) overrides the base map's.
	c.ClientID, _ = get[string](own, "client.id")
	if linger, ok := get[time.Duration](merged, "linger.ms"); ok {
		c.Linger = cmp.Or(linger, NoLinger)
	}
	c.DeliveryTimeout, _ = get[time.Duration](merged, "message.timeout.ms")
	c.TransactionTimeout, _ = get[time.Duration](merged, "transaction.timeout.ms")
	c.MaxQueued, _ = get[int](merged, "queue.buffering.max.messages")
	if txn, ok := merged["transaction.timeout.ms"]; ok {
		if msg := cmp.Or(c.DeliveryTimeout, deliveryTimeout); c.TransactionTimeout < msg {
			r.refuse(txn, "%v is shorter than the message timeout (%v, from queueTimeout or message.timeout.ms); a transaction must be allowed as long as its messages",
				c.TransactionTimeout, msg)
		}
	}
	return c, r.problems
}

// scope is which clients a property configures, and so which map may hold it.
type scope int

const (
	// connection: how every client reaches and authenticates to the cluster, the producers and
	// the election alike; only the base map may set it.
	connection scope = iota
	// everyClient: how a kgo client behaves, whatever it does: from the base map for every
	// client, from the producer map for the producers.
	everyClient
	// producing: the producers' alone, from either map.
	producing
)

// property is how FromProperties reads one librdkafka property.
type property struct {
	scope scope
	// alias names the property this one is another name for, as librdkafka has them; "" for
	// none. Values are kept under the name it gives.
	alias string
	// layer, for a connection property, is the part of security.protocol it configures: "ssl"
	// or "sasl"; "" for one needed by every protocol.
	layer string
	// parse reads a value as YAML or Go gives it (string, bool or number) into what the mapping
	// uses: a string, []string, bool, int, time.Duration or kgo.CompressionCodec.
	parse func(any) (any, error)
}

// maxWireMillis is the longest time Kafka's protocol can carry (an int32 of milliseconds), and
// the upper bound of librdkafka's time properties.
const maxWireMillis = math.MaxInt32 * time.Millisecond

// librdkafkaMessageMaxBytes is librdkafka's default message.max.bytes, the size of the largest
// message it sends.
const librdkafkaMessageMaxBytes = 1_000_000

// properties are the librdkafka properties FromProperties honours. The mapping to kgo is in
// security, clientOpts, producingOpts and FromProperties itself; docs/configuration.md has the
// table users read.
var properties = map[string]property{
	"bootstrap.servers":                     {scope: connection, parse: parseList},
	"security.protocol":                     {scope: connection, parse: parseChoice("plaintext", "ssl", "sasl_plaintext", "sasl_ssl")},
	"sasl.mechanism":                        {scope: connection, layer: "sasl", parse: parseMechanism},
	"sasl.mechanisms":                       {scope: connection, layer: "sasl", parse: parseMechanism, alias: "sasl.mechanism"},
	"sasl.username":                         {scope: connection, layer: "sasl", parse: parseText},
	"sasl.password":                         {scope: connection, layer: "sasl", parse: parseText},
	"ssl.ca.location":                       {scope: connection, layer: "ssl", parse: parseText},
	"ssl.ca.pem":                            {scope: connection, layer: "ssl", parse: parseText},
	"ssl.certificate.location":              {scope: connection, layer: "ssl", parse: parseText},
	"ssl.certificate.pem":                   {scope: connection, layer: "ssl", parse: parseText},
	"ssl.key.location":                      {scope: connection, layer: "ssl", parse: parseText},
	"ssl.key.pem":                           {scope: connection, layer: "ssl", parse: parseText},
	"ssl.key.password":                      {scope: connection, layer: "ssl", parse: parseText},
	"enable.ssl.certificate.verification":   {scope: connection, layer: "ssl", parse: parseBool},
	"ssl.endpoint.identification.algorithm": {scope: connection, layer: "ssl", parse: parseChoice("https", "none")},

	"client.id":                          {scope: everyClient, parse: parseText},
	"socket.connection.setup.timeout.ms": {scope: everyClient, parse: parseMillis(time.Second, maxWireMillis)},
	"retry.backoff.ms":                   {scope: everyClient, parse: parseMillis(time.Millisecond, time.Hour)},
	"retry.backoff.max.ms":               {scope: everyClient, parse: parseMillis(time.Millisecond, time.Hour)},
	"reconnect.backoff.ms":               {scope: everyClient, parse: parseMillis(time.Millisecond, time.Hour)},
	"reconnect.backoff.max.ms":           {scope: everyClient, parse: parseMillis(time.Millisecond, time.Hour)},
	// kgo's bounds: no older than an hour, and no younger than kgo's minimum age (5s).
	"metadata.max.age.ms": {scope: everyClient, parse: parseMillis(5*time.Second, time.Hour)},
	// What Go does anyway: it disables Nagle's algorithm and keeps connections alive.
	"socket.nagle.disable":    {scope: everyClient, parse: parseOnly(true, "Go always disables Nagle's algorithm on its connections")},
	"socket.keepalive.enable": {scope: everyClient, parse: parseOnly(true, "Go always sends TCP keep-alives on its connections")},

	"linger.ms":              {scope: producing, parse: parseMillis(0, time.Minute)}, // kgo's bound
	"queue.buffering.max.ms": {scope: producing, parse: parseMillis(0, time.Minute), alias: "linger.ms"},
	// kgo's least delivery timeout is a second; librdkafka's 0, no limit, it has none.
	"message.timeout.ms":           {scope: producing, parse: parseMillis(time.Second, maxWireMillis)},
	"delivery.timeout.ms":          {scope: producing, parse: parseMillis(time.Second, maxWireMillis), alias: "message.timeout.ms"},
	"transaction.timeout.ms":       {scope: producing, parse: parseMillis(time.Second, maxWireMillis)},
	"request.timeout.ms":           {scope: producing, parse: parseMillis(100*time.Millisecond, 15*time.Minute)},
	"compression.type":             {scope: producing, parse: parseCodec},
	"compression.codec":            {scope: producing, parse: parseCodec, alias: "compression.type"},
	"queue.buffering.max.messages": {scope: producing, parse: parseCount(1, math.MaxInt32)},
	// kgo writes at most 100 MiB to a broker at once (kgo.BrokerMaxWriteBytes, the broker's
	// socket.request.max.bytes default), so no batch may be larger.
	"message.max.bytes": {scope: producing, parse: parseCount(1000, 100<<20)},
	"batch.size":        {scope: producing, parse: parseCount(1, math.MaxInt32)},
	"partitioner": {scope: producing, parse: parseOnly("murmur2_random",
		"the franz client partitions keys only as murmur2_random does (goharvest's default, the Java client's); remove it, or choose the librdkafka client (kafkaClient: librdkafka)")},
}

// values are the properties of one map, or of both merged, that FromProperties read, by the
// name librdkafka's aliases share.
type values map[string]value

// value is a property's parsed value, with where it came from, for Problems about it.
type value struct {
	v        any
	producer bool
	key      string // the property as the map names it
}

// get returns the value of name in v, if it is set.
func get[T any](v values, name string) (T, bool) {
	x, ok := v[name]
	if !ok {
		var zero T
		return zero, false
	}
	return x.v.(T), true
}

// firstSet returns the value of the first of names that v holds, and its name.
func firstSet[T any](v values, names ...string) (T, string, bool) {
	for _, name := range names {
		if x, ok := get[T](v, name); ok {
			return x, name, true
		}
	}
	var zero T
	return zero, names[0], false
}

// setsAny reports whether v holds a property of scope s.
func setsAny(v values, s scope) bool {
	for _, x := range v {
		if properties[x.key].scope == s {
			return true
		}
	}
	return false
}

// reading collects the Problems of one FromProperties.
type reading struct{ problems []Problem }

func (r *reading) add(p Problem) {
	// A base property read for every client and again for the producers is reported once.
	if !slices.Contains(r.problems, p) {
		r.problems = append(r.problems, p)
	}
}

// refuse reports the property that gave x.
func (r *reading) refuse(x value, format string, args ...any) {
	r.add(Problem{x.producer, x.key, fmt.Sprintf(format, args...)})
}

// read parses the properties of one map, refusing those goharvest owns, those this client
// cannot honour, a connection property in the producer map, two names for one setting, and
// values that do not parse.
func (r *reading) read(m map[string]any, producer bool) values {
	v := values{}
	for _, key := range slices.Sorted(maps.Keys(m)) {
		refuse := func(format string, args ...any) { r.add(Problem{producer, key, fmt.Sprintf(format, args...)}) }
		if why, owned := kafkaprops.Owned(key); owned {
			refuse("goharvest sets this property itself (%s); remove it", why)
			continue
		}
		p, known := properties[key]
		if !known {
			refuse("the franz client cannot honour this property; remove it, or choose the librdkafka client (kafkaClient: librdkafka)")
			continue
		}
		if producer && p.scope == connection {
			refuse("the franz client connects its producers and its election alike, so it reads the connection from the base properties (baseKafkaConfig) only; move it there")
			continue
		}
		name := cmp.Or(p.alias, key)
		if other, dup := v[name]; dup {
			refuse("%s sets the same thing (they are two names for it); keep one", other.key)
			continue
		}
		switch m[key].(type) {
		case string, bool, int, int64, float64:
		default:
			refuse("value must be a string, number or boolean, got %T", m[key])
			continue
		}
		parsed, err := p.parse(m[key])
		if err != nil {
			refuse("%v", err)
			continue
		}
		v[name] = value{parsed, producer, key}
	}
	return v
}

// seedBrokers returns bootstrap.servers.
func (r *reading) seedBrokers(v values) []string {
	brokers, _ := get[[]string](v, "bootstrap.servers")
	if len(brokers) == 0 {
		r.add(Problem{false, "bootstrap.servers", "must name at least one host:port"})
	}
	return brokers
}

// clientOpts returns the options of the everyClient properties in v.
func (r *reading) clientOpts(v values) []kgo.Opt {
	var opts []kgo.Opt
	// kgo's dial timeout bounds the TCP connection and the TLS handshake; librdkafka's also the
	// SASL exchange, which kgo bounds as a request.
	if d, ok := get[time.Duration](v, "socket.connection.setup.timeout.ms"); ok {
		opts = append(opts, kgo.DialTimeout(d))
	}
	if d, ok := get[time.Duration](v, "metadata.max.age.ms"); ok {
		opts = append(opts, kgo.MetadataMaxAge(d))
	}
	// kgo has one backoff: the wait before a failed request's next try, which is also when it
	// connects again to a broker it lost (see DefaultRetryBackoff). librdkafka's retry backoff
	// is what it corresponds to, and its reconnect backoff stands in where that is unset.
	first, firstName, setFirst := firstSet[time.Duration](v, "retry.backoff.ms", "reconnect.backoff.ms")
	most, mostName, setMost := firstSet[time.Duration](v, "retry.backoff.max.ms", "reconnect.backoff.max.ms")
	if setFirst || setMost {
		if !setFirst {
			first = min(DefaultRetryBackoff, most)
		}
		if !setMost {
			most = max(DefaultRetryBackoffMax, first)
		}
		if first > most {
			r.refuse(v[firstName], "%v is longer than %s (%v)", first, mostName, most)
		} else {
			opts = append(opts, kgo.RetryBackoffFn(backoff(first, most)))
		}
	}
	return opts
}

// producingOpts returns the options of the producing properties in v that are options rather
// than Config fields.
func (r *reading) producingOpts(v values) []kgo.Opt {
	var opts []kgo.Opt
	if codec, ok := get[kgo.CompressionCodec](v, "compression.type"); ok {
		opts = append(opts, kgo.ProducerBatchCompression(codec))
	}
	// librdkafka's request.timeout.ms is the time the broker is given to acknowledge a produce
	// request, as kgo's is.
	if d, ok := get[time.Duration](v, "request.timeout.ms"); ok {
		opts = append(opts, kgo.ProduceRequestTimeout(d))
	}
	// kgo bounds a batch and any one message by one size (kgo.ProducerBatchMaxBytes). librdkafka
	// bounds a message by message.max.bytes and a batch by batch.size, and sends a message larger
	// than batch.size in a batch of its own; one size does the same only when batch.size is no
	// smaller than message.max.bytes.
	messageMax, setMessageMax := get[int](v, "message.max.bytes")
	batch, setBatch := get[int](v, "batch.size")
	if setMessageMax || setBatch {
		if !setMessageMax {
			messageMax = librdkafkaMessageMaxBytes
		}
		if setBatch && batch < messageMax {
			r.refuse(v["batch.size"], "%d is less than message.max.bytes (%d): the franz client bounds a batch and a message by one size, and would refuse the messages librdkafka sends alone; raise it to message.max.bytes, or remove it",
				batch, messageMax)
		} else {
			opts = append(opts, kgo.ProducerBatchMaxBytes(int32(messageMax)))
		}
	}
	return opts
}

// The parsers of property values. Numbers may be written as strings, as librdkafka reads them.

func parseText(v any) (any, error) { return fmt.Sprint(v), nil }

// parseList reads a comma-separated list, such as bootstrap.servers.
func parseList(v any) (any, error) {
	var list []string
	for item := range strings.SplitSeq(fmt.Sprint(v), ",") {
		if item = strings.TrimSpace(item); item != "" {
			list = append(list, item)
		}
	}
	return list, nil
}

func parseBool(v any) (any, error) {
	if b, ok := v.(bool); ok {
		return b, nil
	}
	switch s := fmt.Sprint(v); {
	case strings.EqualFold(s, "true"):
		return true, nil
	case strings.EqualFold(s, "false"):
		return false, nil
	}
	return nil, fmt.Errorf("%v is not true or false", v)
}

// parseChoice reads one of values, in any case, as the lower-case value.
func parseChoice(values ...string) func(any) (any, error) {
	return func(v any) (any, error) {
		s := strings.ToLower(strings.TrimSpace(fmt.Sprint(v)))
		if !slices.Contains(values, s) {
			return nil, fmt.Errorf("%q is not one of %s", v, strings.Join(values, ", "))
		}
		return s, nil
	}
}

// parseOnly allows only want, the one value the franz client can honour, and says why otherwise.
func parseOnly(want any, why string) func(any) (any, error) {
	return func(v any) (any, error) {
		got := v
		if _, isBool := want.(bool); isBool {
			b, err := parseBool(v)
			if err != nil {
				return nil, err
			}
			got = b
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return nil, fmt.Errorf("%v: only %v can be honoured: %s", v, want, why)
		}
		return got, nil
	}
}

func parseMechanism(v any) (any, error) {
	m := strings.ToUpper(strings.TrimSpace(fmt.Sprint(v)))
	switch m {
	case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		return m, nil
	}
	return nil, fmt.Errorf("%q: the franz client supports PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; for another, choose the librdkafka client (kafkaClient: librdkafka)", v)
}

func parseCodec(v any) (any, error) {
	switch s := strings.ToLower(strings.TrimSpace(fmt.Sprint(v))); s {
	case "none":
		return kgo.NoCompression(), nil
	case "gzip":
		return kgo.GzipCompression(), nil
	case "snappy":
		return kgo.SnappyCompression(), nil
	case "lz4":
		return kgo.Lz4Compression(), nil
	case "zstd":
		return kgo.ZstdCompression(), nil
	}
	return nil, fmt.Errorf("%q is not one of none, gzip, snappy, lz4, zstd", v)
}

// number reads a number, or a string that holds one.
func number(v any) (float64, error) {
	switch v := v.(type) {
	case int:
		return float64(v), nil
	case int64:
		return float64(v), nil
	case float64:
		return v, nil
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(fmt.Sprint(v)), 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a number", v)
	}
	return f, nil
}

// parseMillis reads milliseconds (fractions allowed, as linger.ms allows them) into a duration
// from lo to hi.
func parseMillis(lo, hi time.Duration) func(any) (any, error) {
	return func(v any) (any, error) {
		ms, err := number(v)
		if err != nil {
			return nil, err
		}
		d := time.Duration(ms * float64(time.Millisecond))
		if ms < 0 || d < lo || d > hi {
			return nil, fmt.Errorf("%v ms is out of the franz client's range [%d, %d] ms", v, lo.Milliseconds(), hi.Milliseconds())
		}
		return d, nil
	}
}

// parseCount reads a whole number from lo to hi.
func parseCount(lo, hi int) func(any) (any, error) {
	return func(v any) (any, error) {
		f, err := number(v)
		if err != nil {
			return nil, err
		}
		if f != math.Trunc(f) || f < float64(lo) || f > float64(hi) {
			return nil, fmt.Errorf("%v is not a whole number in the franz client's range [%d, %d]", v, lo, hi)
		}
		return int(f), nil
	}
}
