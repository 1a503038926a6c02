// Package mariadbtest gives tests a real MariaDB server, as package pgtest gives them Postgres.
//
// When GOHARVEST_TEST_MYSQL_DSN is set, tests use that server. Otherwise the first test that asks
// for a database starts a throwaway server from the local binaries (Debian's mariadb-server:
// mariadb-install-db and mariadbd) in a temporary directory, listening on a loopback port that was
// free when it started. Every test gets a database of its own (NewDatabase), so tests and
// packages can run in parallel. A package that uses mariadbtest calls Run from its TestMain so
// that the server is stopped at the end:
//
//	func TestMain(m *testing.M) { os.Exit(mariadbtest.Run(m)) }
package mariadbtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"

	"github.com/goharvest/goharvest/driver/mysql"
)

// EnvDSN names the environment variable that points the tests at an existing server, as a
// go-sql-driver data source ("user:password@tcp(host:port)/"). Its user must be allowed to
// create and drop databases.
const EnvDSN = "GOHARVEST_TEST_MYSQL_DSN"

// Server is a MySQL-compatible server to create databases in: a throwaway one (Start), or an
// existing one (Existing).
type Server struct {
	adminDSN string // a go-sql-driver data source with no database

	// Set only for a throwaway server.
	dir    string    // the temporary directory: data, socket, log
	binary string    // mariadbd
	port   int       // kept across restarts, so that clients reconnect to the same address
	flags  []string  // the Options' server flags
	cmd    *exec.Cmd // mariadbd, a child of this process
	done   chan struct{}
}

// Option changes how Start runs a throwaway server.
type Option func(*[]string)

// Durable makes the server keep every commit through a crash, as production servers run: the redo
// log flushed at each commit. With binaryLog, the binary log is on too (log_bin, the row format a
// replica or a change-data-capture reader needs) and synced at each commit, so that a commit
// waits for both logs, as on a primary with replicas.
func Durable(binaryLog bool) Option {
	return func(flags *[]string) {
		*flags = append(*flags, "--innodb-flush-log-at-trx-commit=1")
		if binaryLog {
			*flags = append(*flags, "--log-bin=mariadb-bin", "--binlog-format=ROW", "--sync-binlog=1", "--server-id=1")
		} else {
			*flags = append(*flags, "--skip-log-bin")
		}
	}
}

// InnoDBMemory sets the buffer pool's and the redo log's sizes (innodb_buffer_pool_size and
// innodb_log_file_size, as the server takes them: "256M"), which a throwaway server keeps small
// (64M and 32M) unless told otherwise. A benchmark that writes for seconds wants a production's:
// a redo log that small fills within seconds at a few thousand rows a second, and the server
// then stalls its commits while it flushes pages to make room.
func InnoDBMemory(bufferPool, redoLog string) Option {
	return func(flags *[]string) {
		*flags = append(*flags, "--innodb-buffer-pool-size="+bufferPool, "--innodb-log-file-size="+redoLog)
	}
}

// LockWaitTimeout sets innodb_lock_wait_timeout: how long a statement waits for a row lock
// before it fails with error 1205 (the server's default is 50s).
func LockWaitTimeout(d time.Duration) Option {
	return func(flags *[]string) {
		*flags = append(*flags, fmt.Sprintf("--innodb-lock-wait-timeout=%d", max(1, int(d/time.Second))))
	}
}

var dbCounter atomic.Int64

// Existing returns a Server for an existing server given by a data source whose user may create
// databases.
func Existing(adminDSN string) *Server { return &Server{adminDSN: adminDSN} }

// AdminDSN returns the data source of the server's administrator, with no database selected.
func (s *Server) AdminDSN() string { return s.adminDSN }

// CreateDatabase creates an empty database and returns a data source that connects to it, and a
// function that drops it.
func (s *Server) CreateDatabase() (dsn string, drop func() error, err error) {
	name := fmt.Sprintf("goharvest_%d_%d", os.Getpid(), dbCounter.Add(1))
	if err := s.exec("CREATE DATABASE " + name); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	drop = func() error {
		if err := s.exec("DROP DATABASE IF EXISTS " + name); err != nil {
			return fmt.Errorf("drop database %s: %w", name, err)
		}
		return nil
	}
	dsn, err = WithDatabase(s.adminDSN, name)
	return dsn, drop, err
}

// WithDatabase returns dsn with its database replaced by name.
func WithDatabase(dsn, name string) (string, error) {
	cfg, err := gomysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("parse data source: %w", err)
	}
	cfg.DBName = name
	return cfg.FormatDSN(), nil
}

func (s *Server) exec(statement string) error {
	db, err := sql.Open("mysql", s.adminDSN)
	if err != nil {
		return err
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = db.ExecContext(ctx, statement)
	return err
}

// Start installs and starts a throwaway server in a new temporary directory. Unless an Option says
// otherwise (Durable), durability is off (the redo log is not flushed at each commit, no binary
// log), as most tests want: the server is thrown away.
func Start(opts ...Option) (*Server, error) {
	install, server, err := findBinaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "goharvest-mariadb-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, binary: server, flags: []string{"--skip-log-bin", "--innodb-flush-log-at-trx-commit=0",
		"--innodb-buffer-pool-size=64M", "--innodb-log-file-size=32M"}}
	for _, opt := range opts {
		opt(&s.flags) // later flags override earlier ones
	}
	data := filepath.Join(dir, "data")
	// root@127.0.0.1 is created without a password (normal authentication, not the socket's),
	// so that a test connects over TCP as it would to any server. As root, the server must be
	// told to run as root: it refuses otherwise, and this one lives only in a temporary directory.
	if err := run(install, "--no-defaults", "--user="+currentUser(), "--datadir="+data,
		"--auth-root-authentication-method=normal", "--skip-test-db", "--skip-name-resolve"); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// The port is free when picked, but another process may take it before the server binds it;
	// then the server exits at once and another port is tried.
	for attempt := 0; ; attempt++ {
		s.port, err = freePort()
		if err != nil {
			s.Stop()
			return nil, err
		}
		err := s.start()
		if err == nil {
			return s, nil
		}
		if attempt == 2 || !errors.Is(err, errExited) {
			s.Stop()
			return nil, err
		}
		s.kill()
	}
}

var errExited = errors.New("mariadbd exited")

// start starts the server on s.port and waits until it answers.
func (s *Server) start() error {
	port := s.port
	logFile := filepath.Join(s.dir, "mariadbd.log")
	s.cmd = exec.Command(s.binary, append([]string{"--no-defaults", "--user=" + currentUser(),
		"--datadir=" + filepath.Join(s.dir, "data"),
		"--socket=" + filepath.Join(s.dir, "mariadbd.sock"),
		"--pid-file=" + filepath.Join(s.dir, "mariadbd.pid"),
		"--log-error=" + logFile,
		"--bind-address=127.0.0.1", "--port=" + strconv.Itoa(port),
		"--skip-name-resolve", // root@127.0.0.1, with no DNS lookups
		"--max-connections=300",
	}, s.flags...)...)
	// Killed with this process if the tests crash, rather than left listening.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start mariadbd: %w", err)
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	cfg := gomysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr = "root", "tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s.adminDSN = cfg.FormatDSN()
	deadline := time.Now().Add(time.Minute)
	for {
		err := s.exec("SELECT 1")
		if err == nil {
			return nil
		}
		select {
		case <-s.done:
			return fmt.Errorf("%w before it answered on port %d: %s (log: %s)", errExited, port, lastLines(logFile), logFile)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mariadbd on port %d did not answer within a minute: %w (log: %s)", port, err, logFile)
		}
	}
}

// Stop kills a throwaway server and removes its directory; for an existing server it does
// nothing. The server is killed rather than shut down (a clean shutdown takes seconds), as
// pgcluster stops Postgres in immediate mode: nothing of it is kept.
func (s *Server) Stop() error {
	if s.dir == "" {
		return nil
	}
	err := s.kill()
	if rmErr := os.RemoveAll(s.dir); err == nil {
		err = rmErr
	}
	s.dir = ""
	return err
}

// PID is the process id of a running throwaway server, for reading its CPU time.
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Restart stops a throwaway server and starts it again on the same port and data, as a server
// restarted by its operator or its supervisor: crash kills it (SIGKILL, as a crash or an OOM kill
// would, so recovery replays the redo log) where a clean restart shuts it down (SIGTERM) first.
// Clients see their connections fail until it answers again.
func (s *Server) Restart(crash bool) error {
	if s.dir == "" || s.cmd == nil {
		return errors.New("mariadbtest: only a running throwaway server can be restarted")
	}
	if crash {
		if err := s.kill(); err != nil {
			return err
		}
	} else {
		if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			return fmt.Errorf("stop mariadbd: %w", err)
		}
		<-s.done
	}
	return s.start()
}

// kill kills the server's process, by its PID, and waits for it to exit.
func (s *Server) kill() error {
	if s.cmd == nil || s.cmd.Process == nil {
		return nil
	}
	var err error
	if kerr := s.cmd.Process.Kill(); kerr != nil && !errors.Is(kerr, os.ErrProcessDone) {
		err = fmt.Errorf("kill mariadbd (pid %d): %w", s.cmd.Process.Pid, kerr)
	}
	<-s.done
	s.cmd = nil
	return err
}

// findBinaries locates mariadb-install-db and the server (mariadbd, or mysqld in older packages).
func findBinaries() (install, server string, err error) {
	install, err = exec.LookPath("mariadb-install-db")
	if err != nil {
		if install, err = exec.LookPath("mysql_install_db"); err != nil {
			return "", "", errors.New("no MariaDB server binaries (mariadb-install-db) found; install MariaDB (the mariadb-server package) or set " + EnvDSN)
		}
	}
	// Debian installs the server in /usr/sbin, which may be outside PATH.
	for _, candidate := range []string{"mariadbd", "mysqld", "/usr/sbin/mariadbd", "/usr/sbin/mysqld"} {
		if path, err := exec.LookPath(candidate); err == nil {
			return install, path, nil
		}
	}
	return "", "", errors.New("no MariaDB server (mariadbd) found; install MariaDB (the mariadb-server package) or set " + EnvDSN)
}

func currentUser() string {
	if os.Geteuid() == 0 {
		return "root"
	}
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	return strconv.Itoa(os.Geteuid())
}

// freePort returns a loopback TCP port that nothing listens on now.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func run(name string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(name), err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s: %w: %s", filepath.Base(name), err, strings.TrimSpace(out.String()))
		}
		return nil
	case <-time.After(2 * time.Minute):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s: timed out after 2m: %s", filepath.Base(name), strings.TrimSpace(out.String()))
	}
}

// lastLines returns the end of a log file, for an error that says why the server stopped.
func lastLines(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], "\n")
}

var (
	startOnce sync.Once
	server    *Server
	startErr  error
)

// Runner is what Run runs: a *testing.M, or a wrapper that prepares something first.
type Runner interface{ Run() int }

// Run runs the package's tests and then stops the throwaway server, if one was started. It
// returns the exit code for os.Exit.
func Run(m Runner) int { return Around(m).Run() }

// Around returns a Runner that runs m and then stops the server as Run does, for a TestMain that
// wraps m in other fixtures too: pgtest.Run(mariadbtest.Around(kafkacluster.Around(m))).
func Around(m Runner) Runner {
	return runnerFunc(func() int {
		code := m.Run()
		if server != nil {
			if err := server.Stop(); err != nil {
				fmt.Fprintln(os.Stderr, "mariadbtest:", err)
			}
		}
		return code
	})
}

type runnerFunc func() int

func (f runnerFunc) Run() int { return f() }

// Shared returns the server the tests use, starting a throwaway one on first use. It fails the
// test when no server can be had.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	s, err := Get()
	if err != nil {
		tb.Fatalf("mariadbtest: start MariaDB: %v", err)
	}
	return s
}

// Get is Shared for code without a testing.TB, such as TestMain.
func Get() (*Server, error) {
	startOnce.Do(func() {
		if dsn := os.Getenv(EnvDSN); dsn != "" {
			server = Existing(dsn)
			return
		}
		server, startErr = Start()
	})
	return server, startErr
}

// NewDatabase creates an empty database for the calling test and returns a go-sql-driver data
// source that connects to it. The database is dropped when the test ends.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	dsn, drop, err := Shared(tb).CreateDatabase()
	if err != nil {
		tb.Fatalf("mariadbtest: %v", err)
	}
	tb.Cleanup(func() {
		if err := drop(); err != nil {
			tb.Errorf("mariadbtest: %v", err)
		}
	})
	return dsn
}

// Open opens a pool on dataSource for the calling test, closed when the test ends: for playing
// writers and operators beside the store under test.
func Open(tb testing.TB, dataSource string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", dataSource)
	if err != nil {
		tb.Fatalf("mariadbtest: %v", err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// NewOutbox creates a database for the calling test, as NewDatabase does, with an outbox table
// named "outbox" and its dead-letter table in it (mysql.CreateOutboxTable), and returns its data
// source.
func NewOutbox(tb testing.TB) string {
	tb.Helper()
	dsn := NewDatabase(tb)
	if err := mysql.CreateOutboxTable(context.Background(), dsn, "outbox"); err != nil {
		tb.Fatalf("mariadbtest: %v", err)
	}
	return dsn
}
