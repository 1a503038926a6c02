// Package mysql is the store driver for an outbox in MySQL or MariaDB (InnoDB), on
// github.com/go-sql-driver/mysql through database/sql, in pure Go:
//
//	store, err := mysql.New("app:secret@tcp(db:3306)/shop", "outbox")
//	// goharvest.Config{Store: store, ...}
//
// CreateOutboxTable makes the outbox table and its dead-letter table (TableDDL shows them). The
// store passes the same contract suite as the Postgres store (drivertest.RunStore), on MariaDB
// 10.11 in this module's tests.
//
// # Claiming rows, and per-key order
//
// The store offers Reader, so epochs claim by reading (the default claim strategy), as well as
// Mark for the mark strategy. Both walk the primary key from the head of the table on every
// claim, as the Postgres store does (docs/how-it-works.md, "How rows are claimed"): a read is one
// SELECT of the oldest rows, leaving out the ids the epoch holds (sent as a list, at most
// MaxInFlightRecords of them) and the rows of held keys. AUTO_INCREMENT ids, like BIGSERIAL, are
// handed out at insert and not at commit, so a row with a lower id can become visible after
// higher ids were read and published; since no read starts from an offset, the next read from the
// head finds it, and publishes it before any record its writer wrote after that commit. A writer
// that could see an earlier record's commit takes a higher id than it: InnoDB hands out
// AUTO_INCREMENT values in increasing order, whatever innodb_autoinc_lock_mode, and keeps its
// counter across restarts (MariaDB 10.2.4, MySQL 8.0); and before those, a restart set it to the
// highest id still in the table plus one, above any record not yet purged. (A table written on
// several primaries at once, with interleaved auto_increment_offset, has no such order; write
// the outbox on one.)
//
// # Isolation, and what waits for what
//
// A read is one statement in autocommit mode: InnoDB gives it a consistent read of the rows
// committed when it starts, at any isolation level, and it takes no lock, so it neither waits
// for a writer's open transaction nor delays one. An open transaction delays only its own rows.
//
// The claims and moves that must see rows as they are (Mark, PurgeUnchanged and DeadLetter, and
// the operators' DeadLetterNow and Requeue) run in transactions at READ COMMITTED, set for each
// transaction rather than taken from the server (whose default is REPEATABLE READ): they pick
// their rows with a consistent read, which does not wait for rows still being inserted (a
// locking read of the head would queue behind every open writer), then lock exactly those rows
// by id (SELECT ... FOR UPDATE), which reads each row's latest committed version, checks it again
// and waits for an operator's change in progress rather than skip it (SKIP LOCKED would let a
// key's later row overtake a locked one). READ COMMITTED also takes no gap locks, which under
// REPEATABLE READ would block the writers' inserts at the tail of the table for as long as the
// transaction lasts.
//
// Every statement that locks rows by id (those, Purge and Reset, which are single statements in
// autocommit) joins the table to its list of ids and looks each up in the primary key, rather
// than say "WHERE id IN (...)": MariaDB scans a small table for that whatever the index hints,
// and a locking scan waits for the first row of any open writer. Purging then stalled behind a
// writer's open transaction in this package's tests; now nothing the harvester does waits for a
// writer (TestNothingWaitsForAnOpenWriter). The join uses JSON_TABLE: MariaDB 10.6 or MySQL 8.0
// at least.
//
// The pool must leave autocommit on (the server's default): a session with autocommit off would
// keep its first read's snapshot, and never see a row committed later.
//
// # What differs from Postgres
//
// MySQL has no LISTEN/NOTIFY: the store is no Listener, so the harvester polls the outbox, at
// least every Limits.MaxMarkBackoff when it is idle, and sooner while records arrive: a record
// written to an idle outbox waits up to that long (1s by default) to be noticed. The reaper
// defaults it to 100ms for a MySQL outbox; a program that embeds the harvester may set it so
// too (docs/mysql.md, "Latency without notifications"). Shards
// (Config.Shards) put a key in the shard outbox.Shard does (ShardSQL), but no index serves a
// shard yet: each shard's claim walks the primary key past the other shards' rows.
// create_time is a TIMESTAMP(6), an instant that does not depend on a session's time zone (its
// range ends in 2038 on MySQL and on MariaDB before 11.5). Header keys and values are JSON
// arrays of strings, so header values are text. The key is compared byte for byte (held keys),
// whatever the column's collation.
package mysql
