package kafkacluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// A secured cluster has three listeners on each node:
//
//	CLIENT      TLS (TLS) or SASL_SSL with SCRAM-SHA-512 (Secure): the only one clients learn,
//	            in Addr and in the metadata the brokers send them
//	INTERNAL    PLAINTEXT, between brokers, and for the fixture's own clients (the readiness
//	            probe, CreateTopic, Coordinator, users and ACLs); its principal, User:ANONYMOUS,
//	            is a super user, so what a test does to ACLs never stops the cluster or the fixture
//	CONTROLLER  PLAINTEXT, as on a plaintext cluster
//
// The client listener's certificate comes from a CA the fixture makes for the cluster (CAFile):
// it names 127.0.0.1 and localhost, so clients verify it as production's do, hostname included
// (librdkafka's ssl.endpoint.identification.algorithm=https, its default).
//
// Kafka reads the key and certificates as PEM (ssl.keystore.type=PEM): the keystore file holds
// the unencrypted PKCS#8 key and the certificate chain, so ssl.key.password is not set.

type security int

const (
	plaintext security = iota
	tlsOnly
	saslSSL
)

// TLS makes the client listener serve TLS only (security.protocol SSL), with a certificate from
// the cluster's own CA (CAFile), and no authentication or authorizer.
func TLS() Option {
	return func(o *options) { o.security = max(o.security, tlsOnly) }
}

// Secure makes the client listener SASL_SSL with SCRAM-SHA-512, over TLS as with TLS, and turns
// on Kafka's StandardAuthorizer with allow.everyone.if.no.acl.found=false: a user may do only
// what its ACLs allow (AddUser, Grant, Revoke). The user "admin" (AdminUser) exists from the
// start, created when the storage is formatted, and is a super user.
func Secure() Option {
	return func(o *options) { o.security = saslSSL }
}

// AdminUser is the super user of a Secure cluster.
const AdminUser = "admin"

// ScramMechanism is the only SASL mechanism of a Secure cluster.
const ScramMechanism = "SCRAM-SHA-512"

// scramIterations is Kafka's minimum, and its default for credentials made by its tools.
const scramIterations = 4096

// secured is what a TLS or Secure cluster adds to a plaintext one.
type secured struct {
	mode     security
	caFile   string // the CA's certificate, PEM
	keystore string // the server's key and certificate chain, PEM
	caPool   *x509.CertPool

	mu    sync.Mutex
	users map[string]string // SCRAM user → password
}

func newSecured(dir string, mode security) (*secured, error) {
	s := &secured{mode: mode, caFile: filepath.Join(dir, "ca.pem"), keystore: filepath.Join(dir, "server.pem"),
		users: map[string]string{}}
	ca, keystore, err := certificates()
	if err != nil {
		return nil, fmt.Errorf("kafkacluster: certificates: %w", err)
	}
	if err := os.WriteFile(s.caFile, ca, 0o644); err != nil {
		return nil, fmt.Errorf("kafkacluster: %w", err)
	}
	if err := os.WriteFile(s.keystore, keystore, 0o600); err != nil {
		return nil, fmt.Errorf("kafkacluster: %w", err)
	}
	s.caPool = x509.NewCertPool()
	s.caPool.AppendCertsFromPEM(ca)
	if mode == saslSSL {
		s.users[AdminUser] = randomPassword()
	}
	return s, nil
}

func randomPassword() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// properties replaces node n's listeners with the three of a secured cluster.
func (s *secured) properties(n *Node, p map[string]string) {
	client := "SSL"
	if s.mode == saslSSL {
		client = "SASL_SSL"
	}
	p["listeners"] = fmt.Sprintf("CLIENT://127.0.0.1:%d,INTERNAL://127.0.0.1:%d,CONTROLLER://127.0.0.1:%d",
		n.Port, n.internalPort, n.controllerPort)
	// Advertised per listener: a client that came in on CLIENT learns only CLIENT addresses.
	p["advertised.listeners"] = fmt.Sprintf("CLIENT://127.0.0.1:%d,INTERNAL://127.0.0.1:%d", n.Port, n.internalPort)
	p["inter.broker.listener.name"] = "INTERNAL"
	p["listener.security.protocol.map"] = "CLIENT:" + client + ",INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
	p["listener.name.client.ssl.keystore.type"] = "PEM"
	p["listener.name.client.ssl.keystore.location"] = s.keystore
	if s.mode != saslSSL {
		return
	}
	p["listener.name.client.sasl.enabled.mechanisms"] = ScramMechanism
	// A broker needs a login module for every SASL mechanism it serves, even one (SCRAM) whose
	// credentials live in the cluster's metadata.
	p["listener.name.client.scram-sha-512.sasl.jaas.config"] = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
	p["authorizer.class.name"] = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
	p["allow.everyone.if.no.acl.found"] = "false" // Kafka's default, stated: a resource without ACLs is closed
	// ANONYMOUS is the principal of the PLAINTEXT listeners, INTERNAL and CONTROLLER, which no
	// client learns of.
	p["super.users"] = "User:ANONYMOUS;User:" + AdminUser
}

// formatArgs are StorageTool format's arguments that create the admin user with the cluster.
func (s *secured) formatArgs() []string {
	if s.mode != saslSSL {
		return nil
	}
	return []string{"--add-scram", fmt.Sprintf("%s=[name=%s,password=%s]", ScramMechanism, AdminUser, s.users[AdminUser])}
}

// probe checks that every running node's client listener serves TLS with the CA's certificate
// and, on a Secure cluster, authenticates the admin user.
func (s *secured) probe(c *Cluster, budget time.Duration) error {
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		if err := s.authenticate(n, AdminUser, min(budget, 10*time.Second)); err != nil {
			return fmt.Errorf("client listener of node %d: %w", n.ID, err)
		}
	}
	return nil
}

// authenticate connects to node n's client listener as user (with TLS alone unless the cluster
// is Secure) and asks for the cluster's metadata.
func (s *secured) authenticate(n *Node, user string, timeout time.Duration) error {
	opts := []kgo.Opt{kgo.SeedBrokers(n.Addr()), kgo.DialTLSConfig(&tls.Config{RootCAs: s.caPool, ServerName: "127.0.0.1"})}
	if s.mode == saslSSL {
		password, ok := s.password(user)
		if !ok {
			return fmt.Errorf("no user %q", user)
		}
		opts = append(opts, kgo.SASL(scram.Auth{User: user, Pass: password}.AsSha512Mechanism()))
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, err = cl.SeedBrokers()[0].Request(ctx, kmsg.NewPtrMetadataRequest())
	return err
}

func (s *secured) password(user string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.users[user]
	return p, ok
}

// certificates makes a CA and a server certificate for 127.0.0.1 and localhost that it signed,
// valid for a day. It returns the CA's certificate and the server's keystore: its PKCS#8 key,
// then its certificate and the CA's, all PEM.
func certificates() (caPEM, keystore []byte, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "goharvest kafkacluster CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	serverKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	server := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	serverDER, err := x509.CreateCertificate(rand.Reader, server, ca, &serverKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(serverKey)
	if err != nil {
		return nil, nil, err
	}
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	keystore = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	keystore = append(keystore, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: serverDER})...)
	keystore = append(keystore, caPEM...)
	return caPEM, keystore, nil
}

// NewCA returns a CA certificate made for a test, PEM-encoded, as a TLS cluster's CA is made:
// for a file that configuration must name but that no connection uses.
func NewCA(tb testing.TB) []byte {
	tb.Helper()
	caPEM, _, err := certificates()
	if err != nil {
		tb.Fatal(err)
	}
	return caPEM
}

// CAFile is the PEM file of the CA that signed the client listener's certificate, for
// ssl.ca.location; "" on a plaintext cluster.
func (c *Cluster) CAFile() string {
	if c.sec == nil {
		return ""
	}
	return c.sec.caFile
}

// ClientConfig returns the librdkafka properties of a client of the cluster: bootstrap.servers,
// and on a secured cluster the TLS settings (the cluster's CA, and the hostname check that is
// librdkafka's default, stated) and, on a Secure one, user's SCRAM credentials (user as AddUser
// made it, or AdminUser). The user is ignored on a cluster without SASL.
func (c *Cluster) ClientConfig(user string) (map[string]string, error) {
	p := map[string]string{"bootstrap.servers": c.Addr()}
	if c.sec == nil {
		return p, nil
	}
	p["security.protocol"] = "SSL"
	p["ssl.ca.location"] = c.sec.caFile
	p["ssl.endpoint.identification.algorithm"] = "https"
	if c.sec.mode != saslSSL {
		return p, nil
	}
	password, ok := c.sec.password(user)
	if !ok {
		return nil, fmt.Errorf("kafkacluster: no user %q (see AddUser)", user)
	}
	p["security.protocol"] = "SASL_SSL"
	p["sasl.mechanisms"] = ScramMechanism
	p["sasl.username"] = user
	p["sasl.password"] = password
	return p, nil
}

// ConfigMap is ClientConfig as a confluent-kafka-go ConfigMap, failing the test if user is unknown.
func (c *Cluster) ConfigMap(tb testing.TB, user string) kafka.ConfigMap {
	tb.Helper()
	p, err := c.ClientConfig(user)
	if err != nil {
		tb.Fatal(err)
	}
	cm := kafka.ConfigMap{}
	for k, v := range p {
		cm[k] = v
	}
	return cm
}

// withAdmin calls f with an admin client of the internal listener, whose principal is a super
// user, and a deadline of 30s, on a Secure cluster.
func (c *Cluster) withAdmin(f func(context.Context, *kafka.AdminClient) error) error {
	if c.sec == nil || c.sec.mode != saslSSL {
		return errors.New("kafkacluster: users and ACLs need a cluster started with Secure()")
	}
	admin, err := kafka.NewAdminClient(&kafka.ConfigMap{"bootstrap.servers": c.internalAddr(), "log_level": 0})
	if err != nil {
		return fmt.Errorf("kafkacluster: %w", err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return f(ctx, admin)
}

// AddUser creates SCRAM-SHA-512 credentials for user (or replaces them), and returns once every
// running node authenticates the user: the controller stores credentials, and each broker learns
// them from the metadata log a moment later.
func (c *Cluster) AddUser(user, password string) error {
	err := c.withAdmin(func(ctx context.Context, admin *kafka.AdminClient) error {
		res, err := admin.AlterUserScramCredentials(ctx, []kafka.UserScramCredentialUpsertion{{
			User:                user,
			ScramCredentialInfo: kafka.ScramCredentialInfo{Mechanism: kafka.ScramMechanismSHA512, Iterations: scramIterations},
			Password:            []byte(password),
		}}, nil)
		if err != nil {
			return err
		}
		if err := res.Errors[user]; err.Code() != kafka.ErrNoError {
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kafkacluster: add user %s: %w", user, err)
	}
	c.sec.mu.Lock()
	c.sec.users[user] = password
	c.sec.mu.Unlock()
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		var err error
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if err = c.sec.authenticate(n, user, 5*time.Second); err == nil {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("kafkacluster: user %s not authenticated by node %d after 30s: %w", user, n.ID, err)
		}
	}
	return nil
}

// NewUser adds a user with a random password (see AddUser) for a test, failing it if that cannot
// be done, and returns the user's client properties (ClientConfig).
func (c *Cluster) NewUser(tb testing.TB, user string) map[string]string {
	tb.Helper()
	if err := c.AddUser(user, randomPassword()); err != nil {
		tb.Fatal(err)
	}
	p, err := c.ClientConfig(user)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// ACL allows User to perform Operation on a resource, from any host.
type ACL struct {
	User      string
	Operation kafka.ACLOperation
	Resource  kafka.ResourceType
	Name      string // the resource's name; ClusterName for the cluster
	// Pattern is LITERAL (the name exactly) unless set to PREFIXED (every name that begins with it).
	Pattern kafka.ResourcePatternType
}

// ClusterName is the name of the cluster resource in ACLs (of type kafka.ResourceBroker, which
// librdkafka's enum calls the cluster).
const ClusterName = "kafka-cluster"

// ResourceTransactionalID is the resource type of transactional IDs: librdkafka has it
// (RD_KAFKA_RESOURCE_TRANSACTIONAL_ID, Kafka's code 5), confluent-kafka-go names no constant for it.
const ResourceTransactionalID = kafka.ResourceType(5)

func (a ACL) pattern() kafka.ResourcePatternType {
	if a.Pattern == kafka.ResourcePatternTypeUnknown {
		return kafka.ResourcePatternTypeLiteral
	}
	return a.Pattern
}

// String reads as docs/operations.md lists ACLs: "WRITE on TransactionalId goharvest.g (PREFIXED)".
func (a ACL) String() string {
	s := fmt.Sprintf("%s on %s %s", a.Operation, resourceName(a.Resource), a.Name)
	if a.pattern() == kafka.ResourcePatternTypePrefixed {
		s += " (PREFIXED)"
	}
	return s
}

func resourceName(t kafka.ResourceType) string {
	switch t {
	case kafka.ResourceTopic:
		return "Topic"
	case kafka.ResourceGroup:
		return "Group"
	case kafka.ResourceBroker:
		return "Cluster"
	case ResourceTransactionalID:
		return "TransactionalId"
	}
	return t.String()
}

func (a ACL) binding() kafka.ACLBinding {
	return kafka.ACLBinding{Type: a.Resource, Name: a.Name, ResourcePatternType: a.pattern(),
		Principal: "User:" + a.User, Host: "*", Operation: a.Operation, PermissionType: kafka.ACLPermissionTypeAllow}
}

// Grant creates acls, and returns once every running broker enforces them.
func (c *Cluster) Grant(acls ...ACL) error {
	bindings := make(kafka.ACLBindings, len(acls))
	for i, a := range acls {
		bindings[i] = a.binding()
	}
	err := c.withAdmin(func(ctx context.Context, admin *kafka.AdminClient) error {
		res, err := admin.CreateACLs(ctx, bindings)
		if err != nil {
			return err
		}
		for i, r := range res {
			if r.Error.Code() != kafka.ErrNoError {
				return fmt.Errorf("%v: %w", acls[i], r.Error)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kafkacluster: grant: %w", err)
	}
	return c.waitACLs(acls, true)
}

// Revoke deletes acls, and returns once no running broker allows them any more.
func (c *Cluster) Revoke(acls ...ACL) error {
	filters := make(kafka.ACLBindingFilters, len(acls))
	for i, a := range acls {
		filters[i] = a.binding()
	}
	err := c.withAdmin(func(ctx context.Context, admin *kafka.AdminClient) error {
		res, err := admin.DeleteACLs(ctx, filters)
		if err != nil {
			return err
		}
		for i, r := range res {
			if r.Error.Code() != kafka.ErrNoError {
				return fmt.Errorf("%v: %w", acls[i], r.Error)
			}
			if len(r.ACLBindings) == 0 {
				return fmt.Errorf("%v: no such ACL", acls[i])
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kafkacluster: revoke: %w", err)
	}
	return c.waitACLs(acls, false)
}

// waitACLs waits until every running broker's authorizer has acls (present) or has none of them.
// The controller stores ACLs; each broker learns them from the metadata log, and answers
// DescribeAcls from what it has learnt, so asking each broker shows when all of them enforce it.
func (c *Cluster) waitACLs(acls []ACL, present bool) error {
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		cl, err := kgo.NewClient(kgo.SeedBrokers(net.JoinHostPort("127.0.0.1", strconv.Itoa(n.internalPort))))
		if err != nil {
			return fmt.Errorf("kafkacluster: %w", err)
		}
		err = waitNodeACLs(cl, acls, present)
		cl.Close()
		if err != nil {
			return fmt.Errorf("kafkacluster: node %d: %w", n.ID, err)
		}
	}
	return nil
}

func waitNodeACLs(cl *kgo.Client, acls []ACL, present bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		var pending []string
		var err error
		for _, a := range acls {
			var found bool
			if found, err = describeACL(ctx, cl, a); err != nil {
				break
			}
			if found != present {
				pending = append(pending, a.String())
			}
		}
		if err == nil && len(pending) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("ACLs not yet in force after 30s (present %v): %v %w", present, strings.Join(pending, "; "), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// describeACL asks the client's seed broker whether it has ACL a.
func describeACL(ctx context.Context, cl *kgo.Client, a ACL) (bool, error) {
	req := kmsg.NewPtrDescribeACLsRequest()
	req.ResourceType = kmsg.ACLResourceType(a.Resource)
	req.ResourceName = &a.Name
	req.ResourcePatternType = kmsg.ACLResourcePatternType(a.pattern())
	principal, host := "User:"+a.User, "*"
	req.Principal, req.Host = &principal, &host
	req.Operation = kmsg.ACLOperation(a.Operation)
	req.PermissionType = kmsg.ACLPermissionTypeAllow
	// To the seed broker itself: RequestWith would go to any broker the client has discovered.
	r, err := cl.SeedBrokers()[0].Request(ctx, req)
	if err != nil {
		return false, err
	}
	resp := r.(*kmsg.DescribeACLsResponse)
	if resp.ErrorCode != 0 {
		return false, fmt.Errorf("describe ACLs: error code %d", resp.ErrorCode)
	}
	return len(resp.Resources) > 0, nil
}
