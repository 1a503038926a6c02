package embed_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/librdkafka"
	"github.com/goharvest/goharvest/internal/testkit/kafkatest"
)

// envResumeChild, when set to a broker's address, makes the test binary run
// resumeCommitWithoutTime against it and exit instead of running tests.
const envResumeChild = "GOHARVEST_TEST_RESUME_COMMIT"

// A commit that outlasts its call goes on inside librdkafka, and the epoch calls
// CommitTransaction again to resume it. librdkafka takes the answer to the commit's EndTxn for
// an abort's unless the call under way is still named commit_transaction, and a resumed call
// whose time runs out before librdkafka has taken it up ends that call for good. So a resume
// made with no time left, as the last one before an epoch's deadline can be, left the commit
// nameless; its answer then moved librdkafka from CommittingTransaction to AbortNotAcked, and
// librdkafka asserted and aborted the process ("BUG: Invalid transaction state transition", a
// reaper stopped in make soak). The producer must not make that call. The broker holds the
// commit (kfake only can); the producer runs in a child process, since the failure aborts it.
func TestResumingACommitWithNoTimeLeftKeepsTheProcess(t *testing.T) {
	broker := kafkatest.Start(t, kafkatest.WithTopics(1, "resume"))
	broker.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
		broker.KeepControl()
		if end, ok := req.(*kmsg.EndTxnRequest); ok && end.Commit {
			broker.SleepControl(func() { time.Sleep(2 * time.Second) })
		}
		return nil, nil, false
	})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envResumeChild+"="+broker.Addr())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "resume: done") {
		t.Fatalf("the producer's process ended with %v; its output:\n%s", err, out)
	}
}

// resumeCommitIfChild runs resumeCommitWithoutTime and exits, in the child process of
// TestResumingACommitWithNoTimeLeftKeepsTheProcess.
func resumeCommitIfChild() {
	addr, ok := os.LookupEnv(envResumeChild)
	if !ok {
		return
	}
	if err := resumeCommitWithoutTime(addr); err != nil {
		fmt.Println("resume:", err)
		os.Exit(1)
	}
	fmt.Println("resume: done")
	os.Exit(0)
}

// resumeCommitWithoutTime commits a transaction whose EndTxn the broker holds for 2s: the
// first call runs out of time with the commit under way; calls to resume it with no time left
// follow, each checked by an abort, which librdkafka refuses while it knows of the commit; and
// once Kafka has answered, a call with time finishes the commit.
func resumeCommitWithoutTime(addr string) error {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := librdkafka.New(librdkafka.Config{Properties: map[string]any{
		// librdkafka's own logger writes at once: its last words before an abort are kept.
		"bootstrap.servers": addr, "go.logs.channel.enable": false,
	}}).NewProducer(driver.ProducerConfig{
		TransactionalID: "resume", Logger: logger,
	})
	if err != nil {
		return err
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.InitTransactions(ctx); err != nil {
		return fmt.Errorf("init transactions: %w", err)
	}
	if err := p.BeginTransaction(); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	// The producer looks the topic up first.
	deadline, _ := ctx.Deadline()
	if err := kafkatest.Produce(p, driver.Message{Topic: "resume", Key: []byte("k"), Value: []byte("v")}, time.Until(deadline)); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	if d := <-p.Deliveries(); d.Err != nil {
		return fmt.Errorf("delivery: %w", d.Err)
	}
	heldUntil := time.Now().Add(2 * time.Second)
	short, cancelShort := context.WithTimeout(context.Background(), 500*time.Millisecond)
	err = p.CommitTransaction(short)
	cancelShort()
	var txnErr *driver.TxnError
	if !errors.As(err, &txnErr) || !txnErr.Retriable {
		return fmt.Errorf("a commit held past its call returned %v; want a retriable error", err)
	}

	// librdkafka's thread must be slow to take a call up for the call to drop the commit, so the
	// calls are made while the machine is kept busy, until Kafka has answered.
	busy, stopBusy := context.WithCancel(context.Background())
	for range 2 * runtime.NumCPU() {
		go func() {
			for busy.Err() == nil {
			}
		}()
	}
	spent, cancelSpent := context.WithDeadline(context.Background(), time.Now())
	defer cancelSpent()
	var dropped error
	for time.Now().Before(heldUntil.Add(500 * time.Millisecond)) {
		p.CommitTransaction(spent)
		if err := p.AbortTransaction(spent); err == nil || !strings.Contains(err.Error(), "Conflicting commit_transaction") {
			dropped = fmt.Errorf("after a call to resume the commit with no time left, an abort returned %v: the commit under way was dropped", err)
			break
		}
	}
	stopBusy()
	if dropped != nil {
		time.Sleep(time.Until(heldUntil.Add(time.Second))) // Kafka answers meanwhile
		return dropped
	}
	if err := p.CommitTransaction(ctx); err != nil {
		return fmt.Errorf("resume the commit with time: %w", err)
	}
	return nil
}
