// Command embed is a service's harvester: it publishes a Postgres outbox to Kafka with the pure-Go
// franz client, until SIGINT or SIGTERM. Run one in every instance of the service; one is elected
// and publishes, the others stand by.
//
//	go run ./examples/embed -dsn 'host=localhost dbname=orders user=postgres' -brokers localhost:9092
//
// It creates the outbox table where it is missing. examples/stasher is a service that writes the
// rows it publishes. The program links pgx and franz-go, and neither librdkafka nor cgo:
// goharvest links only the drivers a program names, and it builds with CGO_ENABLED=0.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver/franz"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/event"
	"github.com/goharvest/goharvest/outbox"
)

func main() {
	dsn := flag.String("dsn", postgres.DefaultDataSource, "Postgres data source of the service's database")
	brokers := flag.String("brokers", "localhost:9092", "Kafka bootstrap servers, comma-separated")
	table := flag.String("table", outbox.DefaultTable, "outbox table")
	group := flag.String("group", "order-service", "the election's consumer group, which every instance of the service shares")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := publishOutbox(ctx, *dsn, strings.Split(*brokers, ","), *table, *group); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

// publishOutbox runs a harvester on the outbox table until ctx ends: it joins the election of
// group and, while elected, publishes the table's rows to Kafka.
func publishOutbox(ctx context.Context, dsn string, brokers []string, table, group string) error {
	if err := postgres.CreateOutboxTable(ctx, dsn, table, outbox.TableOptions{}); err != nil {
		return err
	}
	store, err := postgres.New(dsn, table)
	if err != nil {
		return err
	}
	h, err := goharvest.New(goharvest.Config{
		Store:         store, // the harvester disposes of it when it stops
		Kafka:         franz.New(franz.Config{SeedBrokers: brokers}),
		LeaderGroupID: group,
		LeaderTopic:   group + ".leader",
	})
	if err != nil {
		store.Dispose()
		return err
	}
	h.SetEventHandler(func(e event.Event) {
		switch e := e.(type) {
		case event.LeaderAcquired, event.LeaderRevoked, event.LeaderFenced:
			slog.Info("election", "event", e)
		case event.RecordFailed:
			slog.Error("a record cannot be published", "id", e.ID, "key", e.Key, "error", e.Err)
		}
	})
	slog.Info("publishing while elected; SIGINT or SIGTERM stops", "table", table, "group", group)
	return h.Run(ctx) // publishes while elected, until ctx ends
}
