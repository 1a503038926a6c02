//go:build cgo

package franz_test

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
)

// The franz election keeps the elector contract on Apache Kafka that the librdkafka driver's
// (TestNeliElectorContract) and the in-memory one keep too, at the same short timings: a second's
// heartbeat timeout.
func TestFranzElectorContract(t *testing.T) {
	addr := kafkacluster.Shared(t).Addr()
	run := time.Now().UnixNano()
	for _, partitions := range []int{1, 2} {
		t.Run(fmt.Sprint(partitions), func(t *testing.T) {
			drivertest.RunElector(t, electionOn(addr, fmt.Sprintf("franz-elector-%d", run), partitions))
		})
	}
}

var elections atomic.Int32

// electionOn returns the contract suite's elections on the cluster at addr, each in a group of
// its own named from prefix, with contenders c1, c2, ...
func electionOn(addr, prefix string, partitions int) func(t *testing.T) drivertest.Election {
	return func(t *testing.T) drivertest.Election {
		group := fmt.Sprintf("%s-%d", prefix, elections.Add(1))
		var names atomic.Int32
		return drivertest.Election{
			Join: func(t *testing.T, lost func([]int32)) driver.Elector {
				return newElector(t, addr, group, fmt.Sprintf("c%d", names.Add(1)), partitions, lost)
			},
			Partitions: partitions,
			PulseEvery: 50 * time.Millisecond,
			Within:     time.Minute,
		}
	}
}

// newElector returns a franz contender in group, before its first Pulse, with a second's heartbeat
// timeout.
func newElector(t *testing.T, addr, group, name string, partitions int, lost func([]int32)) driver.Elector {
	t.Helper()
	e, err := franz.New(franz.Config{SeedBrokers: []string{addr}}).NewElector(driver.ElectorConfig{
		LeaderTopic:      group + ".leader",
		LeaderGroupID:    group,
		Partitions:       partitions,
		Name:             name,
		HeartbeatTimeout: time.Second,
		MinPollInterval:  50 * time.Millisecond,
		Barrier:          lost,
		Logger:           slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return e
}
