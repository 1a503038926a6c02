package reaper_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/goharvest/goharvest"
	"github.com/goharvest/goharvest/internal/app/reaper"
	"github.com/goharvest/goharvest/internal/testkit/kafkacluster"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
	"github.com/goharvest/goharvest/internal/testkit/pgtest"
	"github.com/goharvest/goharvest/internal/testkit/verify"
	"github.com/goharvest/goharvest/internal/testkit/verifytest"
	"github.com/goharvest/goharvest/outbox"
	"github.com/goharvest/goharvest/stasher/mysqlstasher"
)

// writeFile writes a reaper configuration into the test's directory and returns its path.
func writeFile(t *testing.T, config string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "reaper.yaml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// command runs a reaper command on the configuration file at path, and returns its exit code
// and its output, standard output then standard error.
func command(path string, args ...string) (int, string) {
	var stdout, stderr bytes.Buffer
	code := reaper.Main(append(args, "-f", path), reaper.Env{Stdout: &stdout, Stderr: &stderr, LookupEnv: os.LookupEnv, Context: context.Background()})
	return code, stdout.String() + stderr.String()
}

// mysqlStash writes records into a MySQL outbox table in one transaction, as a service does
// with package mysqlstasher.
func mysqlStash(t *testing.T, db *sql.DB, table string, records ...outbox.Record) {
	t.Helper()
	st, err := mysqlstasher.New(table)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if err := st.Stash(context.Background(), tx, records...); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}

// mysqlRows counts the rows of a MySQL table.
func mysqlRows(t *testing.T, db *sql.DB, table string) int {
	t.Helper()
	var n int
	if err := db.QueryRow("SELECT COUNT(*) FROM " + table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// reaper init makes a MySQL outbox's table and dead-letter table, refuses -bytea for it, and
// says that it made no shard index.
func TestInitCreatesMySQLTables(t *testing.T) {
	dsn := mariadbtest.NewDatabase(t)
	path := writeFile(t, `harvest:
  database: mysql
  dataSource: "`+dsn+`"
  outboxTable: orders_outbox
  shards: 4
  leaderGroupID: g
  leaderTopic: t
`)
	if code, out := command(path, "init", "-bytea"); code != reaper.ExitFailed || !strings.Contains(out, "-bytea applies to Postgres outboxes") {
		t.Fatalf("init -bytea: exit %d: %s", code, out)
	}
	db := mariadbtest.Open(t, dsn)
	if n := mysqlRows(t, db, "information_schema.tables WHERE table_schema = DATABASE()"); n != 0 {
		t.Fatalf("init -bytea made %d tables", n)
	}
	code, out := command(path, "init")
	if code != reaper.ExitOK || !strings.Contains(out, "outbox table orders_outbox is ready, with its dead-letter table orders_outbox_dead_letters") ||
		!strings.Contains(out, "no index for 4 shards") {
		t.Fatalf("init: exit %d: %s", code, out)
	}
	var columns string
	err := db.QueryRow(`SELECT GROUP_CONCAT(CONCAT(table_name, '.', column_name, ' ', data_type) ORDER BY table_name, column_name)
		FROM information_schema.columns WHERE table_schema = DATABASE() AND column_name IN ('kafka_key', 'error')`).Scan(&columns)
	if want := "orders_outbox.kafka_key varbinary,orders_outbox_dead_letters.error text,orders_outbox_dead_letters.kafka_key varbinary"; err != nil || columns != want {
		t.Fatalf("columns %q (%v), want %q", columns, err, want)
	}
	// Again: the tables exist, which is no error.
	if code, out := command(path, "init"); code != reaper.ExitOK {
		t.Fatalf("init again: exit %d: %s", code, out)
	}
}

// mysqlGrants are the privileges docs/mysql.md says the reaper needs on an outbox table and its
// dead-letter table, for publishing and for the operators' commands.
const mysqlGrants = "SELECT, INSERT, UPDATE, DELETE"

// mysqlHarvester creates a user with only mysqlGrants on the outbox and dead-letter tables of
// the database of dsn (an administrator's), and returns a data source of that user's.
func mysqlHarvester(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	user := "h" + strings.TrimPrefix(cfg.DBName, "goharvest")
	db := mariadbtest.Open(t, dsn)
	for _, statement := range []string{
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'secret'",
		"GRANT " + mysqlGrants + " ON `" + cfg.DBName + "`.`outbox` TO '" + user + "'@'%'",
		"GRANT " + mysqlGrants + " ON `" + cfg.DBName + "`.`outbox_dead_letters` TO '" + user + "'@'%'",
	} {
		if _, err := db.Exec(statement); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { db.Exec("DROP USER '" + user + "'@'%'") })
	cfg.User, cfg.Passwd = user, "secret"
	return cfg.FormatDSN()
}

// Operators list the records a MySQL outbox's reaper holds back, move one to the dead-letter
// table and requeue it, as with Postgres; the reaper and the commands need no privileges but
// mysqlGrants on the two tables.
func TestHeldDeadLetterAndRequeueCommandsOnMySQL(t *testing.T) {
	dsn := mariadbtest.NewOutbox(t)
	db := mariadbtest.Open(t, dsn)
	heldCommands(t, "mysql-held", heldOutbox{
		keys: "database: mysql\n  dataSource: \"" + mysqlHarvester(t, dsn) + `"`,
		insert: func(topic string) int64 {
			res, err := db.Exec(`INSERT INTO outbox (kafka_topic, kafka_key, kafka_value, kafka_header_keys, kafka_header_values)
				VALUES (?, 'k', 'v', '[]', '[]')`, topic)
			if err != nil {
				t.Fatal(err)
			}
			id, err := res.LastInsertId()
			if err != nil {
				t.Fatal(err)
			}
			return id
		},
		rows: func(table string) int { return mysqlRows(t, db, table) },
	})
}

// One reaper, from one file, publishes a Postgres outbox and a MySQL outbox side by side: every
// record of each arrives, in per-key order, both outboxes empty, and the admin endpoints serve
// both.
func TestReaperPublishesPostgresAndMySQLOutboxes(t *testing.T) {
	broker := kafkacluster.Shared(t)
	pgDSN, myDSN := pgtest.NewDatabase(t), mariadbtest.NewDatabase(t)
	pool, db := newPool(t, pgDSN), mariadbtest.Open(t, myDSN)
	billing := testOutbox{name: "billing", table: "outbox", topic: broker.Topic(t, "mixed.billing", 4), pool: pool}
	ordersTopic := broker.Topic(t, "mixed.orders", 4)
	addr := freeAddr(t)
	path := writeFile(t, `harvest:
  baseKafkaConfig:
    bootstrap.servers: `+broker.Addr()+`
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
outboxes:
  - outbox: billing
    leaderGroupID: mixed-billing
    dataSource: "`+pgDSN+`"
  - outbox: orders
    leaderGroupID: mixed-orders
    database: mysql
    dataSource: "`+myDSN+`"
    outboxTable: orders_outbox
    shards: 2
admin:
  address: `+addr+`
`)
	if code, out := command(path, "init"); code != 0 || strings.Count(out, "is ready") != 2 {
		t.Fatalf("init: exit %d:\n%s", code, out)
	}
	const keys, perKey = 20, 25
	stashOrders := func(run string) (*verifytest.Verifier, map[string]int64) {
		records, expected := verify.Backlog(ordersTopic, run, keys, perKey, goharvest.String("v"))
		mysqlStash(t, db, "orders_outbox", records...)
		return verifytest.Start(t, broker.Addr(), ordersTopic, run), expected
	}
	check := func(when string, v *verifytest.Verifier, expected map[string]int64) {
		t.Helper()
		t.Log("waiting for " + when)
		v.WaitDistinct(t, keys*perKey, 2*time.Minute)
		if report := v.Report(expected); !report.OK() {
			t.Fatalf("%s:\n%s", when, report)
		}
	}
	// A backlog before the reaper starts, and another written while it runs.
	billingV, billingWant := billing.stash(t, broker, t.Name()+".1", keys, perKey)
	ordersV, ordersWant := stashOrders(t.Name() + ".1")
	stop := runReaper(t, path)
	defer stop()
	check("billing's backlog", billingV, billingWant)
	check("orders' backlog", ordersV, ordersWant)
	billingV, billingWant = billing.stash(t, broker, t.Name()+".2", keys, perKey)
	ordersV, ordersWant = stashOrders(t.Name() + ".2")
	check("billing's records written while it ran", billingV, billingWant)
	check("orders' records written while it ran", ordersV, ordersWant)

	eventually(t, "both outboxes empty", 15*time.Second, func() (bool, string) {
		var pgRows int
		if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM outbox").Scan(&pgRows); err != nil {
			return false, err.Error()
		}
		myRows := mysqlRows(t, db, "orders_outbox")
		return pgRows == 0 && myRows == 0, fmt.Sprintf("%d rows in billing, %d in orders", pgRows, myRows)
	})
	base := "http://" + addr
	eventually(t, "readyz 200", 15*time.Second, func() (bool, string) {
		code, body := get(base + reaper.ReadyzPath + "?outbox=orders")
		return code == 200, body
	})
	eventually(t, "metrics of both outboxes", 15*time.Second, func() (bool, string) {
		_, body := get(base + reaper.MetricsPath)
		for _, name := range []string{"billing", "orders"} {
			if !regexp.MustCompile(`goharvest_(shard_)?leader\{[^}]*outbox="` + name + `"[^}]*\} 1`).MatchString(body) {
				return false, "no goharvest_leader 1 of outbox " + name
			}
			if !regexp.MustCompile(`goharvest_records_published_total\{[^}]*outbox="` + name + `"`).MatchString(body) {
				return false, "no goharvest_records_published_total of outbox " + name
			}
		}
		return true, ""
	})
	code, body := get(base + reaper.StatusPath + "?outbox=orders")
	if code != 200 || !strings.Contains(body, "MySQL: user root, address ") || !strings.Contains(body, "the database and Kafka answer") ||
		strings.Contains(body, "listenDataSource") {
		t.Errorf("orders' status page: %d\n%s", code, body)
	}
	stop()
}

// A MySQL outbox has no notifications, so the harvester polls it: at light load, one record a
// second, each arriving at an idle outbox, the reaper's default (DefaultMySQLMaxMarkBackoff)
// publishes half the records within medianBound and all within mostBound, which the engine's
// default poll (limits.maxMarkBackoff 1s, in a second outbox as a reference) does not: it waits
// up to 640ms for a record written a second after the last (its empty reads back off 10ms,
// 20ms, ... 640ms), so half wait more than 300ms. The bounds leave room for a loaded machine.
// Both outboxes' latencies, from the insert to the consumer, are logged.
func TestMySQLOutboxLatencyAtLightLoad(t *testing.T) {
	const records, medianBound, mostBound = 30, 250 * time.Millisecond, time.Second
	broker := kafkacluster.Shared(t)
	dsn := mariadbtest.NewDatabase(t)
	db := mariadbtest.Open(t, dsn)
	tables := []string{"polled_default", "polled_1s"}
	topics := []string{broker.Topic(t, "mysql.latency.default", 1), broker.Topic(t, "mysql.latency.1s", 1)}
	path := writeFile(t, `harvest:
  baseKafkaConfig:
    bootstrap.servers: `+broker.Addr()+`
  database: mysql
  dataSource: "`+dsn+`"
  limits:
    heartbeatTimeout: 1s
    minPollInterval: 50ms
outboxes:
  - outbox: polled-default
    outboxTable: polled_default
  - outbox: polled-1s
    outboxTable: polled_1s
    limits:
      maxMarkBackoff: 1s
`)
	if code, out := command(path, "init"); code != 0 {
		t.Fatalf("init: exit %d:\n%s", code, out)
	}
	// The first record of each outbox waits for the election; the measured ones, of another
	// run, follow it.
	warmUp, run := t.Name()+".warm-up", t.Name()
	stop := runReaper(t, path)
	defer stop()
	for i := range tables {
		v := verifytest.Start(t, broker.Addr(), topics[i], warmUp)
		mysqlStash(t, db, tables[i], verify.Record(topics[i], "k", warmUp, 0, nil))
		v.WaitDistinct(t, 1, time.Minute)
	}
	verifiers := []*verifytest.Verifier{verifytest.Start(t, broker.Addr(), topics[0], run), verifytest.Start(t, broker.Addr(), topics[1], run)}
	for seq := range records {
		time.Sleep(time.Second)
		for i := range tables {
			mysqlStash(t, db, tables[i], verify.Record(topics[i], "k", run, int64(seq), nil))
		}
	}
	for i, table := range tables {
		verifiers[i].WaitDistinct(t, records, time.Minute)
		report := verifiers[i].Report(map[string]int64{"k": records})
		if !report.OK() {
			t.Fatalf("%s:\n%s", table, report)
		}
		t.Logf("%s: %d records at one a second: latency p50 %v, p99 %v, max %v", table, records,
			report.P50.Round(time.Millisecond), report.P99.Round(time.Millisecond), report.Max.Round(time.Millisecond))
		if table == "polled_default" && (report.P50 > medianBound || report.P99 > mostBound) {
			t.Errorf("%s: records written to an idle outbox took %v at the median, %v at the 99th percentile; the poll should find them within %v and %v",
				table, report.P50, report.P99, medianBound, mostBound)
		}
	}
	stop()
}
