package goharvest

import (
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/drivertest"
	"github.com/goharvest/goharvest/internal/kafkacluster"
	"github.com/goharvest/goharvest/neli"
)

var contractElections atomic.Int32

// neli, seen through the adapter the harvester uses (electorSeam), keeps the elector contract on
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
						n, err := neli.New(neli.Config{
							KafkaConfig:      map[string]any{"bootstrap.servers": addr},
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
						return electorSeam(n)
					},
					Partitions: partitions,
					PulseEvery: 50 * time.Millisecond,
					Within:     time.Minute,
				}
			})
		})
	}
}
