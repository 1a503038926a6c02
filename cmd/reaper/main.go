// Command reaper publishes a Postgres transactional outbox to Kafka, as a sidecar to services
// written in any language. See README.md, docs/ and examples/.
package main

import (
	"os"

	"github.com/goharvest/goharvest/internal/app/reaper"
)

func main() {
	ctx, stop := reaper.SignalContext()
	reload, stopReload := reaper.ReloadSignal()
	code := reaper.Main(os.Args[1:], reaper.Env{Stdout: os.Stdout, Stderr: os.Stderr, LookupEnv: os.LookupEnv, Context: ctx, Reload: reload})
	stopReload()
	stop()
	os.Exit(code)
}
