package int

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/goharvest/goharvest/driver"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
)

// loneProducers are goharvest's own Kafka producer, the franz driver's at goharvest's defaults,
// with nothing else of goharvest: no election, no Postgres, no engine. Each commits one
// transaction after another, at most one per loneCadence, each writing one record to every
// partition of a topic of their own, as a busy shard's transactions span the partitions its
// keys hash to. Run beside the reapers, they show what a cluster event costs any transactional
// producer on this cluster at these settings: a shard's stall beyond theirs is the relay's doing.
// There is one per node, each node coordinating one's transactional ID, so that an event on a
// node shows a producer whose coordinator moved beside ones whose did not.
type loneProducers struct {
	commits *shardWatch // per producer, when each commit was acknowledged
	nodes   []int       // per producer, the node that coordinated its transactional ID at the start

	mu       sync.Mutex
	failures [][]time.Time // per producer, when it failed (and was made again)
}

// loneCadence is how often each lone producer at most begins a transaction: often enough to
// time a stall to a quarter of a second, seldom enough to add no more transactions a second than
// the reapers' shards commit.
const loneCadence = 250 * time.Millisecond

// startLoneProducers starts one lone producer per node of r's cluster, until the test ends.
func startLoneProducers(t *testing.T, r *rig) *loneProducers {
	t.Helper()
	const partitions = 8
	topic := r.kafka.Topic(t, r.topic+".lone", partitions)
	keys := keysPerPartition(topic, partitions)
	nodes := r.kafka.Nodes()
	var ids []string
	lp := &loneProducers{}
	for i := 0; len(ids) < len(nodes); i++ {
		if i == 1000 {
			t.Fatalf("no transactional IDs coordinated by each of %d nodes among 1000 tried: %v", len(nodes), ids)
		}
		id := fmt.Sprintf("%s.lone-%d", r.group, i)
		n := coordinatorOf(t, r, kafkacluster.TransactionCoordinator, id)
		if !slices.Contains(lp.nodes, n.ID) {
			ids, lp.nodes = append(ids, id), append(lp.nodes, n.ID)
		}
	}
	lp.commits = &shardWatch{arrivals: make([][]time.Time, len(ids))}
	lp.failures = make([][]time.Time, len(ids))
	cl := franz.New(franz.Config{SeedBrokers: strings.Split(r.addr, ",")})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			for ctx.Err() == nil {
				err := lp.run(ctx, cl, i, id, topic, keys)
				if ctx.Err() != nil {
					return
				}
				lp.mu.Lock()
				lp.failures[i] = append(lp.failures[i], time.Now())
				lp.mu.Unlock()
				t.Logf("lone producer %s (coordinated by node %d at the start) failed, and is made again: %v", id, lp.nodes[i], err)
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return lp
}

// keysPerPartition returns a key for each of a topic's partitions, as the franz driver's
// partitioner places keys.
func keysPerPartition(topic string, partitions int) [][]byte {
	place := kgo.StickyKeyPartitioner(nil).ForTopic(topic)
	keys := make([][]byte, partitions)
	for found, i := 0, 0; found < partitions; i++ {
		key := fmt.Appendf(nil, "lone-%d", i)
		if p := place.Partition(&kgo.Record{Key: key}, partitions); keys[p] == nil {
			keys[p], found = key, found+1
		}
	}
	return keys
}

// run commits transactions on a new producer until one fails or ctx ends.
func (lp *loneProducers) run(ctx context.Context, cl *franz.Client, i int, id, topic string, keys [][]byte) error {
	p, err := cl.NewProducer(driver.ProducerConfig{TransactionalID: id, ClientID: id, DeliveryTimeout: 30 * time.Second})
	if err != nil {
		return err
	}
	outstanding := 0
	defer func() {
		p.Abandon()
		for ; outstanding > 0; outstanding-- {
			<-p.Deliveries()
		}
		p.Close()
	}()
	if err := p.InitTransactions(ctx); err != nil {
		return fmt.Errorf("init transactions: %w", err)
	}
	for ctx.Err() == nil {
		next := time.Now().Add(loneCadence)
		if err := p.BeginTransaction(); err != nil {
			return fmt.Errorf("begin: %w", err)
		}
		for _, key := range keys {
			for {
				err := p.Produce(driver.Message{Topic: topic, Key: key, Value: key})
				if err == nil {
					break
				}
				// The driver looks a topic up before its first message, and asks to be called again.
				if !errors.Is(err, driver.ErrTopicPending) && !errors.Is(err, driver.ErrQueueFull) {
					return fmt.Errorf("produce: %w", err)
				}
				select {
				case <-time.After(10 * time.Millisecond):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			outstanding++
		}
		for outstanding > 0 {
			select {
			case d := <-p.Deliveries():
				outstanding--
				if d.Err != nil {
					return fmt.Errorf("delivery: %w", d.Err)
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if err := p.CommitTransaction(ctx); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		lp.commits.arrived(i, time.Now())
		select {
		case <-time.After(time.Until(next)):
		case <-ctx.Done():
		}
	}
	return ctx.Err()
}

// stalls describes each lone producer's longest gap between commits that ended after from and
// began before to, and its failures between from and to, for the figures.
func (lp *loneProducers) stalls(from, to time.Time) string {
	gaps, _ := lp.commits.stalls(from, to)
	lp.mu.Lock()
	defer lp.mu.Unlock()
	parts := make([]string, len(gaps))
	for i, g := range gaps {
		parts[i] = fmt.Sprintf("%v (coordinated by node %d)", g.Round(100*time.Millisecond), lp.nodes[i])
		failed := 0
		for _, at := range lp.failures[i] {
			if at.After(from) && at.Before(to) {
				failed++
			}
		}
		if failed > 0 {
			parts[i] += fmt.Sprintf(" (failed %d times)", failed)
		}
	}
	return strings.Join(parts, ", ")
}
