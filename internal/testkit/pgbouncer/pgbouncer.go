// Package pgbouncer runs a throwaway PgBouncer in front of a PostgreSQL server, for tests and
// benchmarks of the harvester and the stasher behind a connection pooler. It writes a config
// into a temporary directory and listens only on a Unix socket there, so several can run at
// once. PgBouncer refuses to run as root, so as root it runs as the unprivileged "postgres" (or
// "nobody") user, as package pgcluster runs PostgreSQL.
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/goharvest/goharvest/internal/testkit/pgcluster"
	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
)

// Pool modes.
const (
	Session     = "session"
	Transaction = "transaction"
)

const port = 6432

// DatabaseSetting marks a setting for Start that belongs to the server connections' parameters
// (the [databases] entry) rather than to the [pgbouncer] section.
const DatabaseSetting = "database: "

// Bouncer is a running PgBouncer.
type Bouncer struct {
	dir  string
	cmd  *exec.Cmd
	done chan error
	log  *syncbuf.Buffer
}

// Binary returns the path of the pgbouncer executable (Debian installs it in /usr/sbin, which a
// user's PATH may lack), or an error saying how to install it.
func Binary() (string, error) {
	if path, err := exec.LookPath("pgbouncer"); err == nil {
		return path, nil
	}
	for _, path := range []string{"/usr/sbin/pgbouncer", "/usr/local/sbin/pgbouncer", "/usr/local/bin/pgbouncer"} {
		if _, err := os.Stat(path); err == nil {
			return path, nil
		}
	}
	return "", errors.New("pgbouncer not found; install it (Debian: apt-get install pgbouncer; .ci/run does)")
}

// Start runs PgBouncer in the given pool mode in front of the server that upstreamDSN (any
// database on it) reaches, for every database on that server. settings are extra lines for the
// [pgbouncer] section, such as "query_wait_timeout = 2", or, prefixed with DatabaseSetting,
// parameters of the server connections, such as
// DatabaseSetting+"connect_query='SET work_mem = 1024'". Stop it with Stop.
func Start(upstreamDSN, mode string, settings ...string) (*Bouncer, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	up, err := pgconn.ParseConfig(upstreamDSN)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: upstream data source: %w", err)
	}
	dir, err := os.MkdirTemp("", "goharvest-pgbouncer-")
	if err != nil {
		return nil, err
	}
	server := fmt.Sprintf("host=%s port=%d user=%s", up.Host, up.Port, up.User)
	if up.Password != "" {
		server += " password=" + up.Password
	}
	var general []string
	for _, setting := range settings {
		if param, ok := strings.CutPrefix(setting, DatabaseSetting); ok {
			server += " " + param
		} else {
			general = append(general, setting)
		}
	}
	// auth_type any: clients are not authenticated, and every server connection logs in as the
	// upstream user; the admin console then lets anyone in.
	conf := strings.Join(append([]string{
		"[databases]",
		"* = " + server,
		"[pgbouncer]",
		"listen_addr =",
		"listen_port = " + strconv.Itoa(port),
		"unix_socket_dir = " + dir,
		"auth_type = any",
		"admin_users = pgbouncer",
		"pool_mode = " + mode,
		"default_pool_size = 20",
		"max_client_conn = 500",
		"pidfile = " + filepath.Join(dir, "pgbouncer.pid"),
	}, general...), "\n") + "\n"
	confPath := filepath.Join(dir, "pgbouncer.ini")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	b := &Bouncer{dir: dir, done: make(chan error, 1), log: &syncbuf.Buffer{}}
	b.cmd = exec.Command(bin, confPath)
	b.cmd.Stdout, b.cmd.Stderr = b.log, b.log
	if os.Geteuid() == 0 {
		cred, err := pgcluster.UnprivilegedUser("pgbouncer")
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		b.cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	if err := b.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	go func() { b.done <- b.cmd.Wait() }()
	if err := b.waitReady(10 * time.Second); err != nil {
		b.Stop()
		return nil, err
	}
	return b, nil
}

func (b *Bouncer) waitReady(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		select {
		case err := <-b.done:
			b.done <- err
			return fmt.Errorf("pgbouncer exited: %v: %s", err, b.Log())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := b.Admin(ctx, "SHOW VERSION")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgbouncer not answering after %v: %v: %s", within, err, b.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// DSN returns dsn (key=value or URL form) with its host and port replaced by PgBouncer's, so
// that it reaches the same database through the pooler.
func (b *Bouncer) DSN(dsn string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		q := u.Query()
		q.Set("host", b.dir)
		q.Set("port", strconv.Itoa(port))
		q.Set("sslmode", "disable")
		u.Host = ""
		u.RawQuery = q.Encode()
		return u.String()
	}
	// In key=value form the last occurrence of a key wins.
	return fmt.Sprintf("%s host=%s port=%d sslmode=disable", dsn, b.dir, port)
}

// Admin runs a command on PgBouncer's admin console, such as "PAUSE", "RESUME" or "KILL db".
func (b *Bouncer) Admin(ctx context.Context, command string) error {
	cfg, err := pgx.ParseConfig(fmt.Sprintf("host=%s port=%d user=pgbouncer dbname=pgbouncer sslmode=disable", b.dir, port))
	if err != nil {
		return err
	}
	// The console speaks only the simple query protocol.
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("pgbouncer admin: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, command); err != nil {
		return fmt.Errorf("pgbouncer admin %s: %w", command, err)
	}
	return nil
}

// Log returns what PgBouncer has logged so far.
func (b *Bouncer) Log() string { return b.log.String() }

// Stop stops PgBouncer and removes its directory.
func (b *Bouncer) Stop() error {
	b.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		b.cmd.Process.Kill()
		<-b.done
	}
	return os.RemoveAll(b.dir)
}
