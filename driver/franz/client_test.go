package franz

import (
	"math"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/driver"
)

// producerClient returns the kgo client of a producer that New(cfg) makes for p, closed when the
// test ends. It contacts no broker.
func producerClient(t *testing.T, cfg Config, p driver.ProducerConfig) *kgo.Client {
	t.Helper()
	kp, err := New(cfg).NewProducer(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kp.Close)
	return kp.(*producer).cl
}

// optValue is what a kgo client's option should be.
type optValue struct {
	name string
	opt  any // the option's function, as kgo.Client.OptValue takes it
	want any
}

func checkOpts(t *testing.T, cl *kgo.Client, want []optValue) {
	t.Helper()
	for _, w := range want {
		if got := cl.OptValue(w.opt); got != w.want {
			t.Errorf("%s: %v, want %v", w.name, got, w.want)
		}
	}
}

// A producer takes the harvester's client ID and delivery timeout unless Config sets its own, and
// goharvest's linger, transaction timeout and backoff unless Config (or its options) replaces them;
// the options goharvest owns win over Opts, and ProducerOpts over Opts.
func TestNewProducerAppliesConfig(t *testing.T) {
	harvester := driver.ProducerConfig{TransactionalID: "goharvest.g", ClientID: "h1", DeliveryTimeout: 30 * time.Second}
	seeds := []string{"127.0.0.1:1"}

	t.Run("defaults", func(t *testing.T) {
		cl := producerClient(t, Config{SeedBrokers: seeds}, harvester)
		checkOpts(t, cl, []optValue{
			{"client ID", kgo.ClientID, "h1"},
			{"delivery timeout", kgo.RecordDeliveryTimeout, 30 * time.Second},
			{"transaction timeout", kgo.TransactionTimeout, DefaultTransactionTimeout},
			{"linger", kgo.ProducerLinger, DefaultLinger},
			// Bounded by kgo's RetryTimeout rather than by a count the short backoff uses up
			// before Kafka fences a crashed broker.
			{"request retries", kgo.RequestRetries, int64(math.MaxInt32)},
		})
		if codecs := cl.OptValue(kgo.ProducerBatchCompression).([]kgo.CompressionCodec); len(codecs) != 1 || codecs[0] != kgo.NoCompression() {
			t.Errorf("compression %v, want none, as librdkafka's default", codecs)
		}
		retry := cl.OptValue(kgo.RetryBackoffFn).(func(int) time.Duration)
		if first := retry(1); first < DefaultRetryBackoff*8/10 || first > DefaultRetryBackoff*12/10 {
			t.Errorf("the first retry waits %v, want about %v", first, DefaultRetryBackoff)
		}
		for fails := 2; fails < 30; fails++ {
			if d := retry(fails); d > DefaultRetryBackoffMax {
				t.Fatalf("retry %d waits %v, more than DefaultRetryBackoffMax (%v)", fails, d, DefaultRetryBackoffMax)
			}
		}
		if d := retry(20); d < DefaultRetryBackoffMax*8/10 {
			t.Errorf("the 20th retry waits %v, want about DefaultRetryBackoffMax (%v)", d, DefaultRetryBackoffMax)
		}
	})

	t.Run("configured", func(t *testing.T) {
		cfg := Config{
			SeedBrokers: seeds,
			Opts: []kgo.Opt{
				kgo.ClientID("from-opts"),
				kgo.RetryBackoffFn(func(int) time.Duration { return 7 * time.Second }),
				kgo.ProduceRequestTimeout(2 * time.Second),
				kgo.RequiredAcks(kgo.NoAck()),
			},
			ProducerOpts:    []kgo.Opt{kgo.ProduceRequestTimeout(3 * time.Second)},
			ClientID:        "mine",
			DeliveryTimeout: 90 * time.Second,
			Linger:          NoLinger,
		}
		cl := producerClient(t, cfg, harvester)
		checkOpts(t, cl, []optValue{
			{"client ID", kgo.ClientID, "mine"},
			{"delivery timeout", kgo.RecordDeliveryTimeout, 90 * time.Second},
			{"transaction timeout, raised to the delivery timeout", kgo.TransactionTimeout, 90 * time.Second},
			{"linger", kgo.ProducerLinger, time.Duration(0)},
			{"ProducerOpts' request timeout over Opts'", kgo.ProduceRequestTimeout, 3 * time.Second},
			{"goharvest's acks over Opts'", kgo.RequiredAcks, kgo.AllISRAcks()},
		})
		if d := cl.OptValue(kgo.RetryBackoffFn).(func(int) time.Duration)(1); d != 7*time.Second {
			t.Errorf("Opts' backoff did not replace goharvest's: the first retry waits %v", d)
		}
	})

	t.Run("harvester's client ID over the base options'", func(t *testing.T) {
		cl := producerClient(t, Config{SeedBrokers: seeds, Opts: []kgo.Opt{kgo.ClientID("base")}}, harvester)
		if got := cl.OptValue(kgo.ClientID); got != "h1" {
			t.Errorf("client ID %v, want the harvester's, h1, as librdkafka's producer has it", got)
		}
	})
}
