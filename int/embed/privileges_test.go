package embed_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/driver/postgres"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher"
)

// The privileges docs/operations.md lists are enough, with no superuser anywhere: an owner role
// with only CREATE on the schema runs what reaper init runs, a writer role with INSERT on the table and
// USAGE on its sequence stashes, and a harvester role with SELECT, UPDATE (leader_id) and DELETE
// publishes everything and hears the notifications.
func TestHarvestWithLeastPrivileges(t *testing.T) {
	r := newIntRig(t) // its outbox is replaced by one the owner role creates
	ctx := context.Background()
	suffix := fmt.Sprintf("%d_%d", os.Getpid(), time.Now().UnixNano())
	owner, writer, harvester := "gh_owner_"+suffix, "gh_writer_"+suffix, "gh_harvester_"+suffix
	admin := func(sql string) {
		t.Helper()
		if _, err := r.pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	admin("DROP TABLE outbox")
	for _, role := range []string{owner, writer, harvester} {
		admin("CREATE ROLE " + role + " LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE")
	}
	t.Cleanup(func() {
		r.pool.Exec(ctx, "DROP OWNED BY "+owner+", "+writer+", "+harvester)
		for _, role := range []string{owner, writer, harvester} {
			r.pool.Exec(ctx, "DROP ROLE "+role)
		}
	})
	admin("CREATE SCHEMA app")
	admin("GRANT USAGE, CREATE ON SCHEMA app TO " + owner)
	admin("GRANT USAGE ON SCHEMA app TO " + writer + ", " + harvester)
	as := func(role string) string { return r.dsn + " user=" + role }

	if err := postgres.CreateOutboxTable(ctx, as(owner), "app.outbox", outbox.TableOptions{}); err != nil {
		t.Fatalf("reaper init as a role with CREATE on the schema: %v", err)
	}
	conn, err := pgx.Connect(ctx, as(owner))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	for _, grant := range []string{
		"GRANT INSERT ON app.outbox TO " + writer,
		"GRANT USAGE ON SEQUENCE app.outbox_id_seq TO " + writer,
		"GRANT SELECT, UPDATE (leader_id), DELETE ON app.outbox TO " + harvester,
	} {
		if _, err := conn.Exec(ctx, grant); err != nil {
			t.Fatalf("%s: %v", grant, err)
		}
	}

	const keys, perKey = 20, 10
	records, expected := verify.Backlog(r.topic, r.run, keys, perKey, goharvest.String("payload"))
	wconn, err := pgx.Connect(ctx, as(writer))
	if err != nil {
		t.Fatal(err)
	}
	defer wconn.Close(ctx)
	st, _ := stasher.New("app.outbox")
	if err := pgx.BeginFunc(ctx, wconn, func(tx pgx.Tx) error { return st.StashPgx(ctx, tx, records[:keys*perKey/2]...) }); err != nil {
		t.Fatalf("stash as the writer: %v", err)
	}

	v := r.verifier()
	logs := &syncbuf.Buffer{}
	h := r.harvesterWith("least-privilege", goharvest.Limits{MarkBackoff: time.Minute, MaxMarkBackoff: time.Minute}, nil,
		func(c *harvestSettings) {
			c.DataSource, c.OutboxTable = as(harvester), "app.outbox"
			c.Logger = slogTo(logs)
		})
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { h.Stop(); h.Await() }()
	v.WaitDistinct(t, keys*perKey/2, 30*time.Second)
	// Polling is slowed to once a minute: the rest arrives only if the notification does.
	if err := pgx.BeginFunc(ctx, wconn, func(tx pgx.Tx) error { return st.StashPgx(ctx, tx, records[keys*perKey/2:]...) }); err != nil {
		t.Fatalf("stash as the writer: %v", err)
	}
	v.WaitDistinct(t, keys*perKey, 10*time.Second)
	checkDelivered(t, v, expected)
	var left int
	if err := r.pool.QueryRow(ctx, "SELECT count(*) FROM app.outbox").Scan(&left); err != nil || left != 0 {
		t.Errorf("%d rows left in the outbox (%v)", left, err)
	}
	if err := h.Ready(ctx); err != nil {
		t.Errorf("not ready: %v\n%s", err, logs)
	}
}
