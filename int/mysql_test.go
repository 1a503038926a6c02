package int

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/goharvest/goharvest/driver/mysql"
	"github.com/goharvest/goharvest/internal/testkit/mariadbtest"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// The scenarios below run the suite's failover, split-brain, broker-fault and shard scenarios
// with the outbox in MySQL (MariaDB, Debian's server) rather than Postgres, and then what a MySQL
// server brings of its own: its restart, clean and crashed; a lock held past
// innodb_lock_wait_timeout; the reapers' connections killed in the middle of their
// statements; each with the binary log on and off.

func TestMySQLFailover(t *testing.T) {
	failover(t, "failover, MySQL", rigOptions{mysql: true}, 1000, pick(2, 12))
}

func TestMySQLSplitBrain(t *testing.T) {
	splitBrain(t, "split brain, MySQL", rigOptions{mysql: true}, pick(1, 10))
}

func TestMySQLBrokerFaults(t *testing.T) {
	brokerFaults(t, "brokers fail, MySQL", rigOptions{mysql: true}, 1)
}

func TestMySQLShardsReaperLeaves(t *testing.T) {
	shardsReaperLeaves(t, "shards, reaper leaves, MySQL", rigOptions{mysql: true}, pick(2, 8))
}

// mysqlLockWait is the faulted servers' innodb_lock_wait_timeout, short so that a held lock
// fails the reapers' statements within the scenario (the server's default is 50s).
const mysqlLockWait = 2 * time.Second

// The MySQL server fails under a running leader and its standby, on a server of the scenario's
// own that keeps every commit through a crash (innodb_flush_log_at_trx_commit=1), with the binary
// log on (synced at each commit, as on a primary with replicas) and off.
func TestMySQLServerFaults(t *testing.T) {
	for _, binlog := range []bool{true, false} {
		t.Run(map[bool]string{true: "binlog", false: "no binlog"}[binlog], func(t *testing.T) {
			mysqlServerFaults(t, binlog)
		})
	}
}

func mysqlServerFaults(t *testing.T, binlog bool) {
	server, err := mariadbtest.Start(mariadbtest.Durable(binlog), mariadbtest.LockWaitTimeout(mysqlLockWait))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Stop() })
	dsn, _, err := server.CreateDatabase()
	if err != nil {
		t.Fatal(err)
	}
	admin := mariadbtest.Open(t, dsn)
	ctx := context.Background()
	var logBin bool
	if err := admin.QueryRowContext(ctx, "SELECT @@log_bin").Scan(&logBin); err != nil || logBin != binlog {
		t.Fatalf("the server's log_bin is %v (%v), want %v", logBin, err, binlog)
	}
	if err := mysql.CreateOutboxTable(ctx, dsn, "outbox"); err != nil {
		t.Fatal(err)
	}
	r := newRig(t, rigOptions{mysql: true, dsn: dsn})
	// The reapers log in as a user of their own, so that the faults can single out their
	// connections from the writers'.
	r.dsn = mysqlUser(t, admin, dsn, "reaper")
	r.startWriters(4, 1000, 2000)
	reapers := []*reaper{r.startReaper("a"), r.startReaper("b")}
	waitLeader(t, 30*time.Second, reapers...)
	r.waitProgress(1000, 30*time.Second)
	var faults []string
	fault := func(name string, do func()) {
		t.Helper()
		do()
		faults = append(faults, name)
		t.Logf("%s; publishing again", name)
		r.waitProgress(1000, time.Minute)
	}

	fault("the reapers' connections killed mid-statement", func() {
		killed := killMidStatement(t, dsn, "reaper")
		t.Logf("killed %d connections of the reapers, each in a statement or a transaction", killed)
	})
	fault(fmt.Sprintf("the outbox's rows locked for %v", 3*mysqlLockWait), func() {
		lockRows(t, admin, 3*mysqlLockWait)
		if !logged(reapers, "Lock wait timeout exceeded") {
			t.Fatalf("no reaper's statement waited past innodb_lock_wait_timeout: the fault did not bite")
		}
	})
	fault("MariaDB restarted", func() {
		if err := server.Restart(false); err != nil {
			t.Fatal(err)
		}
	})
	fault("MariaDB crashed (SIGKILL) and restarted", func() {
		if err := server.Restart(true); err != nil {
			t.Fatal(err)
		}
	})
	report := r.finish(3 * time.Minute)
	figure(t, "MySQL server faults", "binary log %v; %s; records %d, duplicates %d, lost %d, reversals %d",
		map[bool]string{true: "on", false: "off"}[binlog], strings.Join(faults, ", "),
		report.Expected, report.Duplicates, report.LostCount, len(report.Reversals))
}

// mysqlUser creates a user of the given name with every privilege on dsn's database and
// returns dsn with that user.
func mysqlUser(t *testing.T, admin *sql.DB, dsn, user string) string {
	t.Helper()
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, statement := range []string{
		fmt.Sprintf("CREATE USER '%s'@'127.0.0.1' IDENTIFIED BY '%s'", user, user),
		fmt.Sprintf("GRANT ALL PRIVILEGES ON `%s`.* TO '%s'@'127.0.0.1'", cfg.DBName, user),
	} {
		if _, err := admin.ExecContext(ctx, statement); err != nil {
			t.Fatal(err)
		}
	}
	cfg.User, cfg.Passwd = user, user
	return cfg.FormatDSN()
}

// killMidStatement kills the connections of user that are running a statement or are inside a
// transaction, waiting up to a minute for at least one, and returns how many it killed. A
// reaper's statements are short (with the read claim, a purge is one DELETE), so the connections
// are sampled every millisecond.
func killMidStatement(t *testing.T, dsn, user string) int {
	t.Helper()
	db := mariadbtest.Open(t, dsn)
	ctx := context.Background()
	var killed int
	testwait.UntilEvery(time.Minute, time.Millisecond, func() bool {
		rows, err := db.QueryContext(ctx, `SELECT id FROM information_schema.processlist
			WHERE user = ? AND (command = 'Query'
				OR id IN (SELECT trx_mysql_thread_id FROM information_schema.innodb_trx))`, user)
		if err != nil {
			t.Fatal(err)
		}
		var ids []int64
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, id)
		}
		rows.Close()
		for _, id := range ids {
			if _, err := db.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id)); err == nil {
				killed++
			}
		}
		return killed > 0
	})
	if killed == 0 {
		t.Fatal("no connection of the reapers was seen in a statement or a transaction within a minute")
	}
	return killed
}

// lockRows holds a lock on every row of the outbox (and the gap after the last, so inserts wait
// too) for d, longer than innodb_lock_wait_timeout: the reapers' deletes and the writers'
// inserts fail with error 1205 until it ends.
func lockRows(t *testing.T, db *sql.DB, d time.Duration) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, "SELECT id FROM outbox FOR UPDATE")
	if err != nil {
		t.Fatal(err)
	}
	rows.Close()
	time.Sleep(d) // the fault is the lock held this long
}

// logged reports whether any of ps has logged text.
func logged(ps []*reaper, text string) bool {
	for _, p := range ps {
		b, err := os.ReadFile(p.log.Name())
		if err == nil && strings.Contains(string(b), text) {
			return true
		}
	}
	return false
}
