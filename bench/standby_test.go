package bench_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// BenchmarkAwaitStandbys: what Limits.AwaitStandbys costs in steady state (docs/design-notes.md,
// When Postgres fails over). A durable primary streams asynchronously to one durable standby over loopback TCP,
// on this machine; every case runs against that same pair, each in a fresh database, so that the
// setting is the only difference between awaitStandbys=0 and awaitStandbys=1. With 1, after each
// mark and each purge batch the harvester waits until the standby has flushed the primary's WAL
// position (a replication round trip and the standby's fsync, seen by polling
// pg_stat_replication).
//
//	drain/awaitStandbys=N      BenchmarkDrain: 200,000 records over 10,000 keys, preloaded
//	rate=2000/awaitStandbys=N  BenchmarkSustained at 2,000 records/s for 20 s, for the latency
//
// Each row adds to the usual figures standby-µs/rec, the standby's CPU per record.
func BenchmarkAwaitStandbys(b *testing.B) {
	rig := startBenchRigWith(b, pgcluster.StartDurablePrimary)
	standby, err := rig.server.StartStandby("bench-standby")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { standby.Stop() })
	rig.standby = standby
	// Otherwise the first case's harvester with awaitStandbys=1 would wait for it, timed.
	testwait.For(b, time.Minute, "the standby to stream", func() bool { return streamingStandbys(b, rig.server) == 1 })
	cases := []struct {
		name string
		run  func(*benchRig)
	}{
		{"drain", func(rig *benchRig) { rig.drain(200_000, 10_000, 0, goharvest.DefaultClaimStrategy) }},
		{"rate=2000", func(rig *benchRig) { rig.sustained(2000, goharvest.DefaultClaimStrategy, 0, 1) }},
	}
	for _, c := range cases {
		for _, await := range []int{0, 1} {
			b.Run(c.name+"/awaitStandbys="+strconv.Itoa(await), func(b *testing.B) {
				// The cases share the rig and run one after the other, each reporting to its own b.
				rig.b, rig.awaitStandbys = b, await
				c.run(rig)
			})
		}
	}
}

// streamingStandbys counts the standbys that stream from primary.
func streamingStandbys(b *testing.B, primary *pgcluster.Server) int {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, primary.AdminDSN())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'").Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}
