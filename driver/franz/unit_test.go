package franz_test

import (
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/franz"
)

// These tests need no Kafka broker (kfake at most), and no cgo: they run in any build.

// No dependency of the package outside Go's standard library has cgo files: a program that uses
// it builds with CGO_ENABLED=0, unlike one that uses the librdkafka driver.
func TestNeedsNoCgo(t *testing.T) {
	list := exec.Command("go", "list", "-deps", "-f", "{{if and (not .Standard) .CgoFiles}}{{.ImportPath}}{{end}}", ".")
	// As a cgo build sees them: without cgo, the files that need it are not listed at all.
	list.Env = append(os.Environ(), "CGO_ENABLED=1")
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	if cgo := strings.Fields(string(out)); len(cgo) > 0 {
		t.Errorf("dependencies with cgo: %v", cgo)
	}
}

// NewProducer refuses a config it cannot work with, and calls made out of order are refused
// without contacting a broker, each as the engine expects: Produce outside a transaction may try
// again shortly, a commit with no transaction may not.
func TestCallsOutOfOrderAreRefused(t *testing.T) {
	cfg := driver.ProducerConfig{TransactionalID: "t", Logger: slog.New(slog.DiscardHandler)}
	if _, err := franz.New(franz.Config{}).NewProducer(cfg); err == nil || !strings.Contains(err.Error(), "SeedBrokers") {
		t.Errorf("a client without seed brokers made a producer (error %v)", err)
	}
	// Nothing listens on port 1: none of the calls below may need a broker.
	client := franz.New(franz.Config{SeedBrokers: []string{"127.0.0.1:1"}})
	if _, err := client.NewProducer(driver.ProducerConfig{}); err == nil || !strings.Contains(err.Error(), "TransactionalID") {
		t.Errorf("a producer without a transactional ID was made (error %v)", err)
	}
	p, err := client.NewProducer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		p.Close()
		if _, open := <-p.Deliveries(); open {
			t.Error("Close left Deliveries open")
		}
	}()

	var txnErr *driver.TxnError
	err = p.Produce(driver.Message{Topic: "t", Value: []byte("v")})
	if !errors.As(err, &txnErr) || !txnErr.Retriable {
		t.Errorf("Produce outside a transaction returned %v, want a retriable TxnError", err)
	}
	err = p.CommitTransaction(t.Context())
	if !errors.As(err, &txnErr) || txnErr.Retriable || txnErr.Fatal {
		t.Errorf("CommitTransaction with no transaction returned %v, want a TxnError neither retriable nor fatal", err)
	}
	if err := p.WriteNote(t.Context(), driver.NotePlace{Group: "g", Topic: "t"}, "n"); err == nil {
		t.Error("WriteNote with no transaction succeeded")
	}
	var rejected *driver.RejectedError
	if err := p.Produce(driver.Message{Topic: "no such topic!"}); !errors.As(err, &rejected) || !rejected.ByGoharvest {
		t.Errorf("Produce to an invalid topic name returned %v, want a RejectedError by goharvest", err)
	}
}
