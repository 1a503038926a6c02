// Package pgcluster runs a throwaway PostgreSQL cluster from the local server binaries (found
// through pg_config --bindir or /usr/lib/postgresql/*/bin) in a temporary directory, for tests,
// benchmarks and the demo. The cluster listens only on a Unix socket inside that directory, so
// several can run at once without competing for a port. When run as root, it runs as the
// unprivileged "postgres" (or "nobody") user, because PostgreSQL refuses to run as root.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

var dbCounter atomic.Int64

// Server is a PostgreSQL server to create databases in: a throwaway cluster, or an existing
// server given by its admin DSN (see Existing).
type Server struct {
	adminDSN string

	// Set only for a throwaway cluster.
	binDir  string
	dataDir string
	runAs   *syscall.Credential
	opts    string // the postmaster's settings, for Resume
	port    int    // set for a cluster on TCP (StartTCP, StartPrimary)
	durable bool   // fsync on (StartDurable, StartDurablePrimary), which its standbys inherit
}

// CreateDatabase creates an empty database and returns its DSN and a function that drops it.
func (s *Server) CreateDatabase() (dsn string, drop func() error, err error) {
	name := fmt.Sprintf("goharvest_%d_%d", os.Getpid(), dbCounter.Add(1))
	if err := s.exec(context.Background(), "CREATE DATABASE "+name); err != nil {
		return "", nil, fmt.Errorf("create database: %w", err)
	}
	drop = func() error {
		// FORCE ends connections still open, such as a pool that is closed after this runs.
		if err := s.exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			return fmt.Errorf("drop database: %w", err)
		}
		return nil
	}
	return WithDatabase(s.adminDSN, name), drop, nil
}

// Existing returns a Server for an existing PostgreSQL server; adminDSN's role must be allowed
// to create databases.
func Existing(adminDSN string) *Server { return &Server{adminDSN: adminDSN} }

// WithDatabase returns dsn, in URL or key=value form, with its database replaced by name.
func WithDatabase(dsn, name string) string {
	if u, err := url.Parse(dsn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		u.Path = "/" + name
		return u.String()
	}
	// In key=value form the last occurrence of a key wins.
	return dsn + " dbname=" + name
}

func (s *Server) exec(ctx context.Context, sql string) error { return Exec(ctx, s.adminDSN, sql) }

// Exec runs sql (one statement, or several without parameters) on a connection of its own to dsn.
func Exec(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

// Start initialises and starts a throwaway cluster in a new temporary directory, with
// durability off (fsync, synchronous commit), as tests want.
func Start() (*Server, error) { return startCluster(false, false, nil) }

// StartDurable starts a throwaway cluster with PostgreSQL's default durability (fsync and
// synchronous commit on), for benchmarks whose figures should mean something.
func StartDurable() (*Server, error) { return startCluster(true, false, nil) }

// StartTCP is Start for clients that cannot reach the socket directory, such as a binary run in
// a chroot: the cluster also listens on 127.0.0.1, on a port that was free when it started, and
// the DSNs it gives name that address.
func StartTCP() (*Server, error) { return startCluster(false, true, nil) }

// startCluster starts a throwaway cluster; extra settings ("-c name=value") come last, so they
// override the others.
func startCluster(durable, tcp bool, extra []string) (*Server, error) {
	binDir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "goharvest-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{binDir: binDir, dataDir: filepath.Join(dir, "data"), durable: durable}
	if os.Geteuid() == 0 {
		if s.runAs, err = UnprivilegedUser("PostgreSQL"); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if err := os.Chown(dir, int(s.runAs.Uid), int(s.runAs.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	if err := s.initAndStart(dir, durable, tcp, extra); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Server) initAndStart(dir string, durable, tcp bool, extra []string) error {
	owner := "postgres"
	if err := s.run("initdb", "--no-sync", "--auth=trust", "--username="+owner, "--encoding=UTF8",
		"--locale=C", "-D", s.dataDir); err != nil {
		return err
	}
	host, port := dir, 5432
	listen := "''"
	if tcp {
		var err error
		if port, err = freePort(); err != nil {
			return err
		}
		host, listen = "127.0.0.1", "127.0.0.1"
	}
	settings := []string{
		"-c listen_addresses=" + listen,
		"-c port=" + strconv.Itoa(port),
		"-c unix_socket_directories=" + dir,
		"-c max_connections=300",
	}
	if !durable {
		// The cluster is thrown away, and fsync only slows the tests down.
		settings = append(settings, "-c fsync=off", "-c synchronous_commit=off", "-c full_page_writes=off")
	} else if _, err := os.Stat(filepath.Join(s.binDir, "..", "lib", "pg_stat_statements.so")); err == nil {
		// Benchmarks count and profile statements.
		settings = append(settings, "-c shared_preload_libraries=pg_stat_statements")
	}
	settings = append(settings, extra...)
	opts := strings.Join(settings, " ")
	s.opts = opts
	if err := s.run("pg_ctl", "start", "-w", "-t", "60", "-D", s.dataDir,
		"-l", filepath.Join(dir, "postgres.log"), "-o", opts); err != nil {
		return fmt.Errorf("%w (log: %s)", err, filepath.Join(dir, "postgres.log"))
	}
	s.adminDSN = fmt.Sprintf("host=%s port=%d user=%s dbname=postgres sslmode=disable", host, port, owner)
	if tcp {
		s.port = port
	}
	return nil
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

// Restart stops the cluster and starts it again on the same socket, for tests of database
// outages. The data survives.
func (s *Server) Restart() error {
	if s.dataDir == "" {
		return errors.New("pgcluster: only a throwaway cluster can be restarted")
	}
	// Without -l the new postmaster would write to pg_ctl's output, and waiting for pg_ctl would
	// last as long as the server.
	logFile := filepath.Join(filepath.Dir(s.dataDir), "postgres.log")
	if err := s.run("pg_ctl", "restart", "-w", "-t", "60", "-m", "fast", "-D", s.dataDir, "-l", logFile); err != nil {
		return fmt.Errorf("pgcluster: restart: %w", err)
	}
	return nil
}

// Halt stops the cluster but keeps its data, for tests of a database that is down; Resume
// brings it back.
func (s *Server) Halt() error {
	if s.dataDir == "" {
		return errors.New("pgcluster: only a throwaway cluster can be halted")
	}
	return s.run("pg_ctl", "stop", "-w", "-m", "fast", "-D", s.dataDir)
}

// Resume starts a halted cluster again, with its data and settings.
func (s *Server) Resume() error {
	return s.run("pg_ctl", "start", "-w", "-t", "60", "-D", s.dataDir,
		"-l", filepath.Join(filepath.Dir(s.dataDir), "postgres.log"), "-o", s.opts)
}

// CPUTime returns the CPU time (user and system) used so far by the cluster's processes that
// are running now: the postmaster and its children. Linux only.
func (s *Server) CPUTime() (time.Duration, error) {
	procs, err := s.processes()
	if err != nil {
		return 0, err
	}
	var cpu time.Duration
	for _, fields := range procs {
		cpu += cpuOf(fields)
	}
	return cpu, nil
}

// ProcessCPU returns the CPU time (user and system) a process has used so far. Linux only.
func ProcessCPU(pid int) (time.Duration, error) {
	return statCPU(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
}

// ThreadCPU returns the CPU time (user and system) one thread of a process has used so far.
// Linux only.
func ThreadCPU(pid, tid int) (time.Duration, error) {
	return statCPU(filepath.Join("/proc", strconv.Itoa(pid), "task", strconv.Itoa(tid), "stat"))
}

func statCPU(path string) (time.Duration, error) {
	fields, err := statFieldsAt(path)
	if err != nil {
		return 0, err
	}
	return cpuOf(fields), nil
}

// statFields returns the fields of /proc/PID/stat after the command (which may hold spaces):
// state, ppid, ..., utime (index 11), stime (index 12).
func statFields(pid int) ([]string, error) {
	return statFieldsAt(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
}

// statFieldsAt is statFields of a stat file, a process's or a thread's.
func statFieldsAt(path string) ([]string, error) {
	stat, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	_, rest, ok := strings.Cut(string(stat), ") ")
	fields := strings.Fields(rest)
	if !ok || len(fields) < 13 {
		return nil, fmt.Errorf("pgcluster: %s: unexpected format", path)
	}
	return fields, nil
}

// cpuOf returns the user and system CPU time in a process's statFields.
func cpuOf(fields []string) time.Duration {
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	// USER_HZ is 100 on every Linux this runs on.
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// Freeze stops every process of the cluster (SIGSTOP) until Thaw: every statement, and every
// new connection, hangs, as on a server that stopped answering. Linux only.
func (s *Server) Freeze() error { return s.signalAll(syscall.SIGSTOP) }

// Thaw lets a frozen cluster run again.
func (s *Server) Thaw() error { return s.signalAll(syscall.SIGCONT) }

func (s *Server) signalAll(sig syscall.Signal) error {
	procs, err := s.processes()
	if err != nil {
		return err
	}
	for pid := range procs {
		if err := syscall.Kill(pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("pgcluster: signal %d: %w", pid, err)
		}
	}
	return nil
}

// processes returns the cluster's processes (the postmaster and its children) with their
// statFields.
func (s *Server) processes() (map[int][]string, error) {
	if s.dataDir == "" {
		return nil, errors.New("pgcluster: processes are known only for a throwaway cluster")
	}
	pidFile, err := os.ReadFile(filepath.Join(s.dataDir, "postmaster.pid"))
	if err != nil {
		return nil, err
	}
	postmaster, _, _ := strings.Cut(string(pidFile), "\n")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	procs := map[int][]string{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fields, err := statFields(pid)
		if err != nil {
			continue
		}
		if e.Name() == postmaster || fields[1] == postmaster {
			procs[pid] = fields
		}
	}
	return procs, nil
}

// Stop stops a throwaway cluster and removes its directory; for an existing server it does
// nothing.
func (s *Server) Stop() error {
	if s.dataDir == "" {
		return nil
	}
	var err error
	if _, statErr := os.Stat(filepath.Join(s.dataDir, "postmaster.pid")); statErr == nil {
		err = s.run("pg_ctl", "stop", "-w", "-m", "immediate", "-D", s.dataDir)
	}
	if rmErr := os.RemoveAll(filepath.Dir(s.dataDir)); err == nil {
		err = rmErr
	}
	return err
}

func (s *Server) run(name string, args ...string) error {
	cmd := exec.Command(filepath.Join(s.binDir, name), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if s.runAs != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.runAs}
		// The user's home may not exist; keep tools from looking there.
		cmd.Env = append(os.Environ(), "HOME="+filepath.Dir(s.dataDir))
	}
	cmd.Dir = filepath.Dir(s.dataDir)
	if err := runWithTimeout(cmd, 2*time.Minute); err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(out.String()))
	}
	return nil
}

func runWithTimeout(cmd *exec.Cmd, timeout time.Duration) error {
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		return fmt.Errorf("timed out after %v", timeout)
	}
}

// findBinDir locates the directory holding initdb, pg_ctl and postgres.
func findBinDir() (string, error) {
	var candidates []string
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	// Debian installs the server outside PATH, one directory per major version; prefer the newest.
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(matches, func(i, j int) bool { return versionOf(matches[i]) > versionOf(matches[j]) })
	candidates = append(candidates, matches...)
	if path, err := exec.LookPath("initdb"); err == nil {
		candidates = append(candidates, filepath.Dir(path))
	}
	for _, dir := range candidates {
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	return "", errors.New("no PostgreSQL server binaries (initdb) found; install PostgreSQL (the postgresql package) or use an existing server")
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// UnprivilegedUser returns the credentials of the postgres user, or else of nobody, to run a
// server (named by what, for the error) that refuses to run as root.
func UnprivilegedUser(what string) (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
	}
	return nil, fmt.Errorf("running as root, and neither a postgres nor a nobody user exists to run %s as", what)
}
