package franz_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"

	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/internal/kafkaprops"
)

// These tests need no broker and no cgo: FromProperties reads maps and files, and the kgo clients
// made from its options contact nothing.

const queueTimeout = 30 * time.Second // the harvester's default delivery timeout

// mapped returns FromProperties' Config for the maps, failing the test on any Problem.
func mapped(t *testing.T, base, producer map[string]any) franz.Config {
	t.Helper()
	if base == nil {
		base = map[string]any{"bootstrap.servers": "k1:9092"}
	}
	c, problems := franz.FromProperties(base, producer, queueTimeout)
	if len(problems) > 0 {
		t.Fatalf("problems: %+v", problems)
	}
	return c
}

// client returns a kgo client with opts, closed when the test ends; it contacts no broker.
func client(t *testing.T, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// producerSide is the client a producer's options make: Opts, then ProducerOpts.
func producerSide(t *testing.T, c franz.Config) *kgo.Client {
	return client(t, append(slices.Clone(c.Opts), c.ProducerOpts...)...)
}

// refused returns FromProperties' Problems for the maps, failing the test unless there is one for
// property, from the map producer says, whose reason holds every one of reasons.
func refused(t *testing.T, base, producer map[string]any, fromProducer bool, property string, reasons ...string) []franz.Problem {
	t.Helper()
	_, problems := franz.FromProperties(base, producer, queueTimeout)
	for _, p := range problems {
		if p.Property != property || p.Producer != fromProducer {
			continue
		}
		for _, r := range reasons {
			if !strings.Contains(p.Reason, r) {
				t.Errorf("%s: reason %q lacks %q", property, p.Reason, r)
			}
		}
		return problems
	}
	t.Errorf("no problem for %s (producer map: %v); got %+v", property, fromProducer, problems)
	return problems
}

func withBrokers(m map[string]any) map[string]any {
	m["bootstrap.servers"] = "k1:9092"
	return m
}

// Each producing and client-wide property becomes its kgo option or Config field, under each of
// librdkafka's names for it, from the producer map as from the base map.
func TestPropertiesMapToKgo(t *testing.T) {
	type check func(t *testing.T, c franz.Config)
	opt := func(o any, want any) check {
		return func(t *testing.T, c franz.Config) {
			if got := producerSide(t, c).OptValue(o); got != want {
				t.Errorf("%v, want %v", got, want)
			}
		}
	}
	field := func(get func(franz.Config) any, want any) check {
		return func(t *testing.T, c franz.Config) {
			if got := get(c); got != want {
				t.Errorf("%v, want %v", got, want)
			}
		}
	}
	linger := func(c franz.Config) any { return c.Linger }
	delivery := func(c franz.Config) any { return c.DeliveryTimeout }
	codec := func(want kgo.CompressionCodec) check {
		return func(t *testing.T, c franz.Config) {
			got := producerSide(t, c).OptValue(kgo.ProducerBatchCompression).([]kgo.CompressionCodec)
			if !slices.Equal(got, []kgo.CompressionCodec{want}) {
				t.Errorf("compression %v, want only %v", got, want)
			}
		}
	}
	for _, c := range []struct {
		property string
		value    any
		check    check
	}{
		{"linger.ms", 20, field(linger, 20*time.Millisecond)},
		{"linger.ms", "0.5", field(linger, 500*time.Microsecond)},
		{"linger.ms", 0, field(linger, franz.NoLinger)},
		{"queue.buffering.max.ms", 7, field(linger, 7*time.Millisecond)},
		{"message.timeout.ms", 60000, field(delivery, time.Minute)},
		{"delivery.timeout.ms", "45000", field(delivery, 45*time.Second)},
		{"transaction.timeout.ms", 120000, field(func(c franz.Config) any { return c.TransactionTimeout }, 2*time.Minute)},
		{"queue.buffering.max.messages", 5000, field(func(c franz.Config) any { return c.MaxQueued }, 5000)},
		{"request.timeout.ms", 15000, opt(kgo.ProduceRequestTimeout, 15*time.Second)},
		{"message.max.bytes", 2_000_000, opt(kgo.ProducerBatchMaxBytes, int32(2_000_000))},
		{"batch.size", 1_000_000, opt(kgo.ProducerBatchMaxBytes, int32(1_000_000))}, // librdkafka's message.max.bytes
		{"compression.type", "none", codec(kgo.NoCompression())},
		{"compression.type", "gzip", codec(kgo.GzipCompression())},
		{"compression.type", "snappy", codec(kgo.SnappyCompression())},
		{"compression.type", "LZ4", codec(kgo.Lz4Compression())},
		{"compression.codec", "zstd", codec(kgo.ZstdCompression())},
		{"socket.connection.setup.timeout.ms", 5000, opt(kgo.DialTimeout, 5*time.Second)},
		{"metadata.max.age.ms", 60000, opt(kgo.MetadataMaxAge, time.Minute)},
		{"partitioner", "murmur2_random", field(func(c franz.Config) any { return len(c.ProducerOpts) }, 0)},
		{"socket.nagle.disable", true, field(func(c franz.Config) any { return len(c.ProducerOpts) }, 0)},
		{"socket.keepalive.enable", "true", field(func(c franz.Config) any { return len(c.ProducerOpts) }, 0)},
	} {
		for _, inProducer := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s=%v/producer=%v", c.property, c.value, inProducer), func(t *testing.T) {
				props := map[string]any{c.property: c.value}
				if inProducer {
					c.check(t, mapped(t, nil, props))
				} else {
					c.check(t, mapped(t, withBrokers(props), nil))
				}
			})
		}
	}
}

// The producer map's value of a property wins over the base map's, under either name.
func TestProducerPropertiesOverrideBase(t *testing.T) {
	c := mapped(t, withBrokers(map[string]any{"linger.ms": 50, "compression.type": "gzip", "request.timeout.ms": 9000}),
		map[string]any{"queue.buffering.max.ms": 5, "compression.codec": "zstd"})
	if c.Linger != 5*time.Millisecond {
		t.Errorf("linger %v, want the producer map's 5ms", c.Linger)
	}
	cl := producerSide(t, c)
	if got := cl.OptValue(kgo.ProducerBatchCompression).([]kgo.CompressionCodec); !slices.Equal(got, []kgo.CompressionCodec{kgo.ZstdCompression()}) {
		t.Errorf("compression %v, want the producer map's zstd", got)
	}
	if got := cl.OptValue(kgo.ProduceRequestTimeout); got != 9*time.Second {
		t.Errorf("request timeout %v, want the base map's 9s", got)
	}
}

// bootstrap.servers is a comma-separated list; client.id in the base map names every client
// (Opts), in the producer map the producers (Config.ClientID, which wins over the harvester's
// name, as in librdkafka).
func TestBrokersAndClientID(t *testing.T) {
	c := mapped(t, map[string]any{"bootstrap.servers": " k1:9092, k2:9093 ,", "client.id": "shared"}, map[string]any{"client.id": "producer"})
	if !slices.Equal(c.SeedBrokers, []string{"k1:9092", "k2:9093"}) {
		t.Errorf("seed brokers %q", c.SeedBrokers)
	}
	if got := client(t, c.Opts...).OptValue(kgo.ClientID); got != "shared" {
		t.Errorf("every client's ID %v, want shared", got)
	}
	if c.ClientID != "producer" {
		t.Errorf("the producers' ID %q, want producer", c.ClientID)
	}
	refused(t, map[string]any{"bootstrap.servers": " , "}, nil, false, "bootstrap.servers", "at least one host:port")
	refused(t, map[string]any{}, nil, false, "bootstrap.servers", "at least one host:port")
}

// reconnect.backoff.ms and reconnect.backoff.max.ms bound kgo's retry backoff where
// retry.backoff.ms and retry.backoff.max.ms are unset, from the base map for every client and from
// the producer map for the producers only.
func TestReconnectBackoff(t *testing.T) {
	c := mapped(t, withBrokers(map[string]any{"reconnect.backoff.ms": 50}), map[string]any{"reconnect.backoff.max.ms": 400})
	shared := client(t, c.Opts...).OptValue(kgo.RetryBackoffFn).(func(int) time.Duration)
	producing := producerSide(t, c).OptValue(kgo.RetryBackoffFn).(func(int) time.Duration)
	for _, b := range []struct {
		name        string
		fn          func(int) time.Duration
		first, most time.Duration
	}{
		{"every client", shared, 50 * time.Millisecond, franz.DefaultRetryBackoffMax},
		{"producers", producing, 50 * time.Millisecond, 400 * time.Millisecond},
	} {
		if d := b.fn(1); d < b.first*8/10 || d > b.first*12/10 {
			t.Errorf("%s: first wait %v, want about %v", b.name, d, b.first)
		}
		if d := b.fn(30); d < b.most*8/10 || d > b.most {
			t.Errorf("%s: 30th wait %v, want about %v and no more", b.name, d, b.most)
		}
	}
	// retry.backoff.ms and retry.backoff.max.ms, kgo's own counterparts, win.
	retry := client(t, mapped(t, withBrokers(map[string]any{"reconnect.backoff.ms": 50, "retry.backoff.ms": 20, "retry.backoff.max.ms": 300}), nil).Opts...).
		OptValue(kgo.RetryBackoffFn).(func(int) time.Duration)
	if d := retry(1); d < 16*time.Millisecond || d > 24*time.Millisecond {
		t.Errorf("retry.backoff.ms 20 beside reconnect.backoff.ms 50: first wait %v, want about 20ms", d)
	}
	if d := retry(30); d < 240*time.Millisecond || d > 300*time.Millisecond {
		t.Errorf("retry.backoff.max.ms 300: 30th wait %v, want about 300ms and no more", d)
	}
	// Set alone, the first wait raises goharvest's default bound rather than conflict with it.
	if d := client(t, mapped(t, withBrokers(map[string]any{"reconnect.backoff.ms": 2000}), nil).Opts...).
		OptValue(kgo.RetryBackoffFn).(func(int) time.Duration)(30); d < 1600*time.Millisecond || d > 2*time.Second {
		t.Errorf("reconnect.backoff.ms 2000 alone: the 30th wait is %v, want about 2s", d)
	}
	refused(t, withBrokers(map[string]any{"reconnect.backoff.ms": 3000, "reconnect.backoff.max.ms": 2000}), nil, false,
		"reconnect.backoff.ms", "3s is longer than reconnect.backoff.max.ms (2s)")
}

// Every property goharvest owns is refused with the reason the librdkafka client gives, in
// either map.
func TestOwnedPropertiesAreRefused(t *testing.T) {
	for _, table := range []map[string]string{kafkaprops.Election, kafkaprops.Producer} {
		for property, why := range table {
			refused(t, withBrokers(map[string]any{property: "x"}), nil, false, property, "goharvest sets this property itself ("+why+"); remove it")
			refused(t, withBrokers(map[string]any{}), map[string]any{property: "x"}, true, property, "goharvest sets this property itself")
		}
	}
}

// A property the client does not know is refused, naming the way out.
func TestUnknownPropertiesAreRefused(t *testing.T) {
	for _, property := range []string{"debug", "retries", "compression.level", "ssl.keystore.location", "sasl.kerberos.service.name",
		"queue.buffering.max.kbytes", "metadata.broker.list", "api.version.request"} {
		refused(t, withBrokers(map[string]any{property: "1"}), nil, false, property,
			"the franz client cannot honour this property; remove it, or choose the librdkafka client (kafkaClient: librdkafka)")
		refused(t, withBrokers(map[string]any{}), map[string]any{property: "1"}, true, property, "cannot honour")
	}
}

// Values the client cannot use are refused, each naming its property and why.
func TestBadValuesAreRefused(t *testing.T) {
	for _, c := range []struct {
		property string
		value    any
		reason   string
	}{
		{"linger.ms", 120000, "out of the franz client's range [0, 60000] ms"},
		{"linger.ms", "soon", `"soon" is not a number`},
		{"message.timeout.ms", 0, "range [1000,"},
		{"transaction.timeout.ms", -5, "range [1000,"},
		{"request.timeout.ms", 50, "range [100, 900000]"},
		{"metadata.max.age.ms", 1000, "range [5000, 3600000]"},
		{"queue.buffering.max.messages", 2.5, "not a whole number"},
		{"message.max.bytes", 200 << 20, "range [1000, 104857600]"},
		{"compression.type", "brotli", `"brotli" is not one of none, gzip, snappy, lz4, zstd`},
		{"partitioner", "consistent_random", "only murmur2_random can be honoured"},
		{"socket.nagle.disable", false, "Go always disables Nagle's algorithm"},
		{"socket.keepalive.enable", "maybe", "not true or false"},
		{"linger.ms", []int{1}, "value must be a string, number or boolean, got []int"},
	} {
		refused(t, nil, map[string]any{c.property: c.value}, true, c.property, c.reason)
	}
	// Two names for one setting in one map.
	refused(t, nil, map[string]any{"linger.ms": 1, "queue.buffering.max.ms": 1}, true, "queue.buffering.max.ms", "linger.ms sets the same thing")
	refused(t, nil, map[string]any{"message.timeout.ms": 1000, "delivery.timeout.ms": 1000}, true, "message.timeout.ms", "delivery.timeout.ms sets the same thing")
	// A batch bound below the message bound would refuse messages librdkafka sends alone.
	refused(t, nil, map[string]any{"batch.size": 100_000}, true, "batch.size", "100000 is less than message.max.bytes (1000000)")
	refused(t, withBrokers(map[string]any{"message.max.bytes": 3_000_000}), map[string]any{"batch.size": 2_000_000}, true, "batch.size",
		"less than message.max.bytes (3000000)")
}

// A transaction timeout shorter than the messages' is refused, as librdkafka refuses it: the
// harvester's queue timeout, or message.timeout.ms when set.
func TestTransactionTimeoutCoversDeliveries(t *testing.T) {
	refused(t, nil, map[string]any{"transaction.timeout.ms": 20000}, true, "transaction.timeout.ms",
		"20s is shorter than the message timeout (30s, from queueTimeout or message.timeout.ms)")
	refused(t, withBrokers(map[string]any{"transaction.timeout.ms": 60000}), map[string]any{"delivery.timeout.ms": 90000}, false,
		"transaction.timeout.ms", "1m0s is shorter than the message timeout (1m30s")
	mapped(t, nil, map[string]any{"transaction.timeout.ms": 30000})
}

// Connection properties belong in the base map: the producers and the election connect alike.
func TestConnectionPropertiesOnlyInBase(t *testing.T) {
	for _, property := range []string{"bootstrap.servers", "security.protocol", "sasl.mechanism", "sasl.password", "ssl.ca.location"} {
		refused(t, withBrokers(map[string]any{}), map[string]any{property: "x"}, true, property,
			"reads the connection from the base properties (baseKafkaConfig) only; move it there")
	}
}

// security.protocol's SASL mechanisms, each from its user name and password, in any case.
func TestSASLMechanisms(t *testing.T) {
	for _, c := range []struct{ protocol, property, mechanism, want string }{
		{"SASL_SSL", "sasl.mechanism", "PLAIN", "PLAIN"},
		{"sasl_plaintext", "sasl.mechanisms", "SCRAM-SHA-256", "SCRAM-SHA-256"},
		{"Sasl_Ssl", "sasl.mechanism", "scram-sha-512", "SCRAM-SHA-512"},
	} {
		cfg := mapped(t, map[string]any{"bootstrap.servers": "k1:9092", "security.protocol": c.protocol, c.property: c.mechanism,
			"sasl.username": "u", "sasl.password": "p"}, nil)
		cl := client(t, cfg.Opts...)
		mechanisms := cl.OptValue(kgo.SASL).([]sasl.Mechanism)
		if len(mechanisms) != 1 || mechanisms[0].Name() != c.want {
			t.Errorf("%s %s: mechanisms %v, want %s", c.protocol, c.mechanism, mechanisms, c.want)
		}
		if tlsOn := cl.OptValue(kgo.DialTLSConfig) != (*tls.Config)(nil); tlsOn != strings.HasSuffix(strings.ToLower(c.protocol), "ssl") {
			t.Errorf("%s: TLS %v", c.protocol, tlsOn)
		}
	}
	sasl := func(extra map[string]any) map[string]any {
		m := map[string]any{"bootstrap.servers": "k1:9092", "security.protocol": "sasl_ssl"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	refused(t, sasl(map[string]any{"sasl.mechanism": "GSSAPI"}), nil, false, "sasl.mechanism", `"GSSAPI": the franz client supports PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512`)
	refused(t, sasl(map[string]any{"sasl.username": "u", "sasl.password": "p"}), nil, false, "sasl.mechanism",
		"not set, and librdkafka's default, GSSAPI (Kerberos), the franz client does not support")
	refused(t, sasl(map[string]any{"sasl.mechanism": "PLAIN", "sasl.password": "p"}), nil, false, "sasl.username", "SASL PLAIN needs a user name and a password")
	refused(t, sasl(map[string]any{"sasl.mechanism": "PLAIN", "sasl.username": "u"}), nil, false, "sasl.password", "needs a user name and a password")
	refused(t, map[string]any{"bootstrap.servers": "k", "security.protocol": "ssl", "sasl.username": "u"}, nil, false, "sasl.username",
		"has no effect, since security.protocol is ssl; remove it, or set security.protocol to sasl_plaintext or sasl_ssl")
	refused(t, map[string]any{"bootstrap.servers": "k", "sasl.mechanism": "PLAIN"}, nil, false, "sasl.mechanism", "security.protocol is plaintext")
	refused(t, map[string]any{"bootstrap.servers": "k", "security.protocol": "kerberos"}, nil, false, "security.protocol",
		`"kerberos" is not one of plaintext, ssl, sasl_plaintext, sasl_ssl`)
}

// pki is a CA made for a test, which issues certificates.
type pki struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &pki{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate for name (a host name or an IP address), server and client alike,
// and its key, as PEM.
func (p *pki) issue(t *testing.T, name string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, KeyUsage: x509.KeyUsageDigitalSignature}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.cert, &key.PublicKey, p.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

func writeFile(t *testing.T, dir, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// handshake connects to a TLS server that presents server and, with clientCAs, asks for a client
// certificate from them, as kgo connects: with the broker's host as the server name. It returns
// the client's error and the server's.
func handshake(t *testing.T, server tls.Certificate, clientCAs *x509.CertPool, client *tls.Config) (clientErr, serverErr error) {
	t.Helper()
	serverCfg := &tls.Config{Certificates: []tls.Certificate{server}}
	if clientCAs != nil {
		serverCfg.ClientCAs, serverCfg.ClientAuth = clientCAs, tls.RequireAndVerifyClientCert
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", serverCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err == nil {
			err = conn.(*tls.Conn).Handshake()
			conn.Close()
		}
		served <- err
	}()
	cfg := client.Clone()
	cfg.ServerName = "127.0.0.1"
	conn, clientErr := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cfg)
	if clientErr == nil {
		// Under TLS 1.3 the server checks the client's certificate after the client is done: read
		// to hear its verdict.
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, clientErr = conn.Read(make([]byte, 1))
		if strings.Contains(fmt.Sprint(clientErr), "EOF") {
			clientErr = nil
		}
		conn.Close()
	}
	return clientErr, <-served
}

// tlsOf returns the TLS settings of a Config's options.
func tlsOf(t *testing.T, c franz.Config) *tls.Config {
	t.Helper()
	cfg, _ := client(t, c.Opts...).OptValue(kgo.DialTLSConfig).(*tls.Config)
	if cfg == nil {
		t.Fatal("no TLS")
	}
	return cfg
}

// The TLS properties: the CA and client certificate read from files or given inline, an encrypted
// key, and the verification librdkafka would do, each checked by a handshake.
func TestTLS(t *testing.T) {
	ca, other := newPKI(t), newPKI(t)
	dir := t.TempDir()
	caFile := writeFile(t, dir, "ca.pem", ca.pem)
	serverCert, serverKey := ca.issue(t, "broker.invalid") // a name that is not the host dialled
	server, err := tls.X509KeyPair(serverCert, serverKey)
	if err != nil {
		t.Fatal(err)
	}
	rightHost, rightHostKey := ca.issue(t, "127.0.0.1")
	clientCert, clientKey := ca.issue(t, "billing-api")
	certFile, keyFile := writeFile(t, dir, "client.pem", clientCert), writeFile(t, dir, "client.key", clientKey)
	ssl := func(extra map[string]any) map[string]any {
		m := map[string]any{"bootstrap.servers": "127.0.0.1:9093", "security.protocol": "SSL"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}

	t.Run("host name checked by default", func(t *testing.T) {
		cfg := tlsOf(t, mapped(t, ssl(map[string]any{"ssl.ca.location": caFile}), nil))
		var wrongHost x509.HostnameError
		if err, _ := handshake(t, server, nil, cfg); !errors.As(err, &wrongHost) {
			t.Errorf("a certificate for another host: %v, want a host name error", err)
		}
		right, err := tls.X509KeyPair(rightHost, rightHostKey)
		if err != nil {
			t.Fatal(err)
		}
		if err, _ := handshake(t, right, nil, cfg); err != nil {
			t.Errorf("the broker's own certificate was refused: %v", err)
		}
		cfg = tlsOf(t, mapped(t, ssl(map[string]any{"ssl.ca.pem": string(ca.pem), "ssl.endpoint.identification.algorithm": "https"}), nil))
		if err, _ := handshake(t, right, nil, cfg); err != nil {
			t.Errorf("with ssl.ca.pem: %v", err)
		}
	})
	t.Run("endpoint identification none", func(t *testing.T) {
		cfg := tlsOf(t, mapped(t, ssl(map[string]any{"ssl.ca.location": caFile, "ssl.endpoint.identification.algorithm": "none"}), nil))
		if err, _ := handshake(t, server, nil, cfg); err != nil {
			t.Errorf("the chain is trusted and the host name not checked, yet: %v", err)
		}
		cfg = tlsOf(t, mapped(t, ssl(map[string]any{"ssl.ca.pem": string(other.pem), "ssl.endpoint.identification.algorithm": "none"}), nil))
		if err, _ := handshake(t, server, nil, cfg); err == nil {
			t.Error("a certificate from an untrusted CA was accepted")
		}
	})
	t.Run("verification off", func(t *testing.T) {
		cfg := tlsOf(t, mapped(t, ssl(map[string]any{"ssl.ca.pem": string(other.pem), "enable.ssl.certificate.verification": false}), nil))
		if err, _ := handshake(t, server, nil, cfg); err != nil {
			t.Errorf("with verification off: %v", err)
		}
	})
	clientCAs := x509.NewCertPool()
	clientCAs.AddCert(ca.cert)
	t.Run("client certificate", func(t *testing.T) {
		for name, props := range map[string]map[string]any{
			"files":  {"ssl.certificate.location": certFile, "ssl.key.location": keyFile},
			"inline": {"ssl.certificate.pem": string(clientCert), "ssl.key.pem": string(clientKey)},
		} {
			props["ssl.ca.location"] = caFile
			props["ssl.endpoint.identification.algorithm"] = "none"
			cfg := tlsOf(t, mapped(t, ssl(props), nil))
			if clientErr, serverErr := handshake(t, server, clientCAs, cfg); clientErr != nil || serverErr != nil {
				t.Errorf("%s: client %v, server %v", name, clientErr, serverErr)
			}
		}
		cfg := tlsOf(t, mapped(t, ssl(map[string]any{"ssl.ca.location": caFile, "ssl.endpoint.identification.algorithm": "none"}), nil))
		if _, serverErr := handshake(t, server, clientCAs, cfg); serverErr == nil {
			t.Error("the server took a client without a certificate; the test proves nothing")
		}
	})
	t.Run("encrypted key", func(t *testing.T) {
		block, _ := pem.Decode(clientKey)
		encrypted, err := x509.EncryptPEMBlock(rand.Reader, block.Type, block.Bytes, []byte("s3cret"), x509.PEMCipherAES256)
		if err != nil {
			t.Fatal(err)
		}
		encFile := writeFile(t, dir, "client-enc.key", pem.EncodeToMemory(encrypted))
		props := map[string]any{"ssl.ca.location": caFile, "ssl.endpoint.identification.algorithm": "none",
			"ssl.certificate.location": certFile, "ssl.key.location": encFile, "ssl.key.password": "s3cret"}
		cfg := tlsOf(t, mapped(t, ssl(props), nil))
		if clientErr, serverErr := handshake(t, server, clientCAs, cfg); clientErr != nil || serverErr != nil {
			t.Errorf("client %v, server %v", clientErr, serverErr)
		}
		props["ssl.key.password"] = "wrong"
		// Usually the padding gives a wrong password away; otherwise the key does not parse.
		refused(t, ssl(props), nil, false, "ssl.key.password")
		delete(props, "ssl.key.password")
		refused(t, ssl(props), nil, false, "ssl.key.location", "the key is encrypted: set ssl.key.password")
		pkcs8 := writeFile(t, dir, "pkcs8.key", pem.EncodeToMemory(&pem.Block{Type: "ENCRYPTED PRIVATE KEY", Bytes: []byte{1}}))
		props["ssl.key.location"], props["ssl.key.password"] = pkcs8, "s3cret"
		refused(t, ssl(props), nil, false, "ssl.key.password", "encrypted PKCS#8, which the franz client cannot decrypt")
	})
	t.Run("bad files", func(t *testing.T) {
		missing := filepath.Join(dir, "missing.pem")
		refused(t, ssl(map[string]any{"ssl.ca.location": missing}), nil, false, "ssl.ca.location", missing, "no such file")
		refused(t, ssl(map[string]any{"ssl.ca.location": keyFile}), nil, false, "ssl.ca.location", "holds no PEM certificate")
		refused(t, ssl(map[string]any{"ssl.certificate.location": missing, "ssl.key.location": keyFile}), nil, false,
			"ssl.certificate.location", missing)
		refused(t, ssl(map[string]any{"ssl.certificate.location": certFile, "ssl.key.location": caFile}), nil, false,
			"ssl.key.location", "with ssl.certificate.location")
		refused(t, ssl(map[string]any{"ssl.certificate.location": certFile}), nil, false, "ssl.certificate.location", "needs its key")
		refused(t, ssl(map[string]any{"ssl.key.pem": string(clientKey)}), nil, false, "ssl.key.pem", "needs its certificate")
		refused(t, ssl(map[string]any{"ssl.key.password": "x"}), nil, false, "ssl.key.password", "no key to decrypt")
		refused(t, ssl(map[string]any{"ssl.ca.location": caFile, "ssl.ca.pem": string(ca.pem)}), nil, false, "ssl.ca.pem", "ssl.ca.location is set too")
	})
	t.Run("system CAs", func(t *testing.T) {
		for _, props := range []map[string]any{{}, {"ssl.ca.location": "probe"}} {
			if cfg := tlsOf(t, mapped(t, ssl(props), nil)); cfg.RootCAs != nil || cfg.InsecureSkipVerify {
				t.Errorf("%v: roots %v, skip verify %v; want the system's roots, verified", props, cfg.RootCAs, cfg.InsecureSkipVerify)
			}
		}
	})
	t.Run("TLS settings without TLS", func(t *testing.T) {
		refused(t, map[string]any{"bootstrap.servers": "k", "ssl.ca.location": caFile}, nil, false, "ssl.ca.location",
			"has no effect, since security.protocol is plaintext; remove it, or set security.protocol to ssl or sasl_ssl")
		refused(t, map[string]any{"bootstrap.servers": "k", "security.protocol": "sasl_plaintext", "sasl.mechanism": "PLAIN",
			"sasl.username": "u", "sasl.password": "p", "enable.ssl.certificate.verification": false}, nil, false,
			"enable.ssl.certificate.verification", "security.protocol is sasl_plaintext")
	})
}
