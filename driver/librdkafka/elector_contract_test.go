package librdkafka_test

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/driver/librdkafka"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
)

var contractElections atomic.Int32

// The client's election (neli, through the adapter the harvester uses) keeps the elector contract on
// Apache Kafka that the in-memory election keeps too (driver/memory runs the same suite). Short
// timings, as neli's own tests use, keep it quick: a second's heartbeat timeout.
func TestNeliElectorContract(t *testing.T) {
	addr := kafkacluster.Shared(t).Addr()
	run := time.Now().UnixNano()
	for _, partitions := range []int{1, 2} {
		t.Run(fmt.Sprint(partitions), func(t *testing.T) {
			drivertest.RunElector(t, func(t *testing.T) drivertest.Election {
				group := fmt.Sprintf("elector-contract-%d-%d", run, contractElections.Add(1))
				var names atomic.Int32
				return drivertest.Election{
					Join: func(t *testing.T, lost func([]int32)) driver.Elector {
						kafka := librdkafka.New(librdkafka.Config{Properties: map[string]any{"bootstrap.servers": addr}})
						e, err := kafka.NewElector(driver.ElectorConfig{
							LeaderTopic:      group + ".leader",
							LeaderGroupID:    group,
							Partitions:       partitions,
							Name:             fmt.Sprintf("c%d", names.Add(1)),
							HeartbeatTimeout: time.Second,
							MinPollInterval:  50 * time.Millisecond,
							Barrier:          lost,
							Logger:           slog.New(slog.DiscardHandler),
						})
						if err != nil {
							t.Fatal(err)
						}
						return e
					},
					Partitions: partitions,
					PulseEvery: 50 * time.Millisecond,
					Within:     time.Minute,
				}
			})
		})
	}
}
