// Command pump writes load to a goharvest outbox and checks, end to end, that every record
// reaches Kafka in per-key order. Run pump -h for its flags.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/goharvest/goharvest/internal/app/pump"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := pump.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
