package verifytest

import (
	"context"
	"testing"

	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/stasher"
)

// StashBacklog writes perKey stamped records (see verify.Backlog) for each of keys keys into the
// outbox table "outbox" through db, and returns the count per key to check deliveries against.
func StashBacklog(tb testing.TB, db stasher.PgxExecer, topic, run string, keys, perKey int, value *string) map[string]int64 {
	tb.Helper()
	records, expected := verify.Backlog(topic, run, keys, perKey, value)
	st, err := stasher.New("outbox")
	if err != nil {
		tb.Fatal(err)
	}
	if err := st.StashPgx(context.Background(), db, records...); err != nil {
		tb.Fatal(err)
	}
	return expected
}
