package franz

import (
	"cmp"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// The security properties: TLS (ssl.*) and SASL (sasl.*), read as librdkafka reads them.

// security returns the options for security.protocol: TLS (kgo.DialTLSConfig) for ssl and
// sasl_ssl, SASL (kgo.SASL) for sasl_plaintext and sasl_ssl. A TLS or SASL property that the
// protocol does not use is refused, since librdkafka would ignore it: likelier a forgotten
// security.protocol than a setting meant to do nothing.
func (r *reading) security(v values) []kgo.Opt {
	protocol, _ := get[string](v, "security.protocol")
	protocol = cmp.Or(protocol, "plaintext") // librdkafka's default
	uses := map[string]bool{
		"ssl":  protocol == "ssl" || protocol == "sasl_ssl",
		"sasl": protocol == "sasl_plaintext" || protocol == "sasl_ssl",
	}
	protocols := map[string]string{"ssl": "ssl or sasl_ssl", "sasl": "sasl_plaintext or sasl_ssl"}
	for _, name := range slices.Sorted(maps.Keys(v)) {
		x := v[name]
		if layer := properties[x.key].layer; layer != "" && !uses[layer] {
			r.refuse(x, "has no effect, since security.protocol is %s; remove it, or set security.protocol to %s", protocol, protocols[layer])
		}
	}
	var opts []kgo.Opt
	if uses["ssl"] {
		if cfg := r.tlsConfig(v); cfg != nil {
			opts = append(opts, kgo.DialTLSConfig(cfg))
		}
	}
	if uses["sasl"] {
		if m := r.saslMechanism(v); m != nil {
			opts = append(opts, kgo.SASL(m))
		}
	}
	return opts
}

// tlsConfig returns the TLS settings of the ssl.* properties, or nil after a Problem. kgo sets
// each connection's server name to the broker's host, so the host name is verified as
// librdkafka's default (ssl.endpoint.identification.algorithm https) verifies it.
func (r *reading) tlsConfig(v values) *tls.Config {
	cfg := &tls.Config{}
	failed := false
	// Without a CA the system's are trusted, as librdkafka trusts OpenSSL's (and "probe" asks).
	if ca, from := r.pemOf(v, "ssl.ca.location", "ssl.ca.pem"); ca != nil {
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(ca) {
			r.refuse(from, "holds no PEM certificate")
			failed = true
		}
	} else if from.key != "" && from.v != "probe" {
		failed = true // reported by pemOf
	}

	certPEM, cert := r.pemOf(v, "ssl.certificate.location", "ssl.certificate.pem")
	keyPEM, key := r.pemOf(v, "ssl.key.location", "ssl.key.pem")
	password, hasPassword := v["ssl.key.password"]
	switch {
	case cert.key == "" && key.key == "":
		if hasPassword {
			r.refuse(password, "there is no key to decrypt: set ssl.key.location or ssl.key.pem, or remove it")
			failed = true
		}
	case cert.key == "":
		r.refuse(key, "a client key needs its certificate: set ssl.certificate.location or ssl.certificate.pem")
		failed = true
	case key.key == "":
		r.refuse(cert, "a client certificate needs its key: set ssl.key.location or ssl.key.pem")
		failed = true
	case certPEM == nil || keyPEM == nil:
		failed = true // reported by pemOf
	default:
		keyPEM, decrypted, err := decryptKey(keyPEM, password)
		if err != nil {
			if hasPassword { // a wrong password, or a key it cannot decrypt
				key = password
			}
			r.refuse(key, "%v", err)
			failed = true
			break
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			if decrypted { // RFC 1423 cannot always tell a wrong password from a right one
				r.refuse(password, "the key it decrypts does not go with %s (a wrong password?): %v", cert.key, err)
			} else {
				r.refuse(key, "with %s: %v", cert.key, err)
			}
			failed = true
			break
		}
		cfg.Certificates = []tls.Certificate{pair}
	}

	verify, set := get[bool](v, "enable.ssl.certificate.verification")
	hostCheck, _ := get[string](v, "ssl.endpoint.identification.algorithm")
	switch {
	case set && !verify:
		cfg.InsecureSkipVerify = true // no verification at all, as librdkafka then does
	case hostCheck == "none":
		// Go verifies the chain and the host name together or not at all: skip both, and
		// verify the chain alone once the handshake has the broker's certificates.
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = verifyChain(cfg.RootCAs)
	}
	if failed {
		return nil
	}
	return cfg
}

// pemOf returns the PEM of a setting that librdkafka takes as a file (location) or inline: the
// file's contents, or the inline text, and the property that gave it. data is nil when neither is
// set (from.key is then ""), when location is "probe" (librdkafka's system CAs), and after a
// Problem.
func (r *reading) pemOf(v values, location, inline string) (data []byte, from value) {
	file, hasFile := v[location]
	text, hasText := v[inline]
	switch {
	case hasFile && hasText:
		r.refuse(text, "%s is set too; set one", location)
		return nil, text
	case hasText:
		return []byte(text.v.(string)), text
	case hasFile && file.v == "probe":
		return nil, file
	case hasFile:
		data, err := os.ReadFile(file.v.(string))
		if err != nil {
			r.refuse(file, "%v", err) // names the path and why
			return nil, file
		}
		return data, file
	}
	return nil, value{}
}

// decryptKey returns keyPEM decrypted with the ssl.key.password property when the key is
// encrypted, and whether it was. Go reads the legacy PEM encryption (RFC 1423, "Proc-Type:
// 4,ENCRYPTED") that `openssl rsa -aes256 -traditional` writes, but not encrypted PKCS#8
// ("ENCRYPTED PRIVATE KEY", OpenSSL 3's default), which is refused.
func decryptKey(keyPEM []byte, password value) (_ []byte, decrypted bool, _ error) {
	block, _ := pem.Decode(keyPEM)
	switch {
	case block == nil:
		return keyPEM, false, nil // tls.X509KeyPair says what is wrong
	case block.Type == "ENCRYPTED PRIVATE KEY":
		return nil, false, errors.New("the key is encrypted PKCS#8, which the franz client cannot decrypt: decrypt it (openssl pkcs8 -in key.pem -out plain.pem), or choose the librdkafka client (kafkaClient: librdkafka)")
	case !x509.IsEncryptedPEMBlock(block):
		return keyPEM, false, nil
	case password.key == "":
		return nil, false, errors.New("the key is encrypted: set ssl.key.password")
	}
	// Go deprecates RFC 1423 decryption for its weakness to a padding oracle, which a key read
	// from a file does not offer; it is still what older tools write.
	der, err := x509.DecryptPEMBlock(block, []byte(password.v.(string)))
	if err != nil {
		return nil, false, fmt.Errorf("decrypt the key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: block.Type, Bytes: der}), true, nil
}

// verifyChain verifies a broker's certificate chain against roots (the system's when nil),
// without its host name: ssl.endpoint.identification.algorithm none.
func verifyChain(roots *x509.CertPool) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the broker sent no certificate")
		}
		opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(opts)
		return err
	}
}

// saslMechanism returns the SASL mechanism of the sasl.* properties, or nil after a Problem.
func (r *reading) saslMechanism(v values) sasl.Mechanism {
	mechanism, ok := get[string](v, "sasl.mechanism")
	if !ok {
		r.add(Problem{false, "sasl.mechanism", "not set, and librdkafka's default, GSSAPI (Kerberos), the franz client does not support: set PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"})
		return nil
	}
	user, hasUser := get[string](v, "sasl.username")
	password, hasPassword := get[string](v, "sasl.password")
	if !hasUser || !hasPassword {
		for _, name := range []string{"sasl.username", "sasl.password"} {
			if _, set := v[name]; !set {
				r.add(Problem{false, name, fmt.Sprintf("not set; SASL %s needs a user name and a password", mechanism)})
			}
		}
		return nil
	}
	switch mechanism {
	case "PLAIN":
		return plain.Auth{User: user, Pass: password}.AsMechanism()
	case "SCRAM-SHA-256":
		return scram.Auth{User: user, Pass: password}.AsSha256Mechanism()
	}
	return scram.Auth{User: user, Pass: password}.AsSha512Mechanism() // parseMechanism allows no other
}
