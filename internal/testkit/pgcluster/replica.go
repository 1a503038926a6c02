package pgcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// A primary and its streaming standbys, for tests of a database failover: StartPrimary, then
// StartStandby on it; Crash the primary and Promote a standby. They all listen on 127.0.0.1 (each
// on a port of its own), so that a multi-host data source (MultiHostDSN) can name them, and
// replicate over loopback TCP, as a standby on another machine would.

// primarySettings make a cluster a primary that streams to standbys. StartPrimary leaves
// durability off (fsync), which a killed process does not need; synchronous_commit is on, so that a commit
// waits for a synchronous standby once synchronous_standby_names names one.
var primarySettings = []string{
	"-c wal_level=replica",
	"-c max_wal_senders=10",
	"-c synchronous_commit=on",
	// A base backup forces full-page writes anyway; a standby needs them in the WAL it replays.
	"-c full_page_writes=on",
}

// StartPrimary starts a throwaway cluster on 127.0.0.1 (as StartTCP) that standbys can stream
// from (StartStandby).
func StartPrimary() (*Server, error) { return startCluster(false, true, primarySettings) }

// StartDurablePrimary is StartPrimary with PostgreSQL's default durability and
// pg_stat_statements, as StartDurable: for benchmarks of what replication costs, whose standbys
// then flush their WAL to disk too, as a real standby does before it reports the flush.
func StartDurablePrimary() (*Server, error) { return startCluster(true, true, primarySettings) }

// Port returns the TCP port of a cluster started by StartTCP, StartPrimary or StartStandby, 0
// for one on a Unix socket only.
func (s *Server) Port() int { return s.port }

// AdminDSN returns the data source of the server's postgres database, as its superuser.
func (s *Server) AdminDSN() string { return s.adminDSN }

// StartStandby takes a base backup of the primary s (pg_basebackup over loopback TCP) into a new
// temporary directory and starts it as a hot standby streaming from s, on a port of its own.
// name is its application_name on the primary (pg_stat_replication), which
// synchronous_standby_names can list.
func (s *Server) StartStandby(name string) (*Server, error) {
	if s.dataDir == "" || s.port == 0 {
		return nil, errors.New("pgcluster: a standby needs a throwaway primary on TCP (StartPrimary)")
	}
	dir, err := os.MkdirTemp("", "goharvest-pg-standby-")
	if err != nil {
		return nil, err
	}
	st := &Server{binDir: s.binDir, dataDir: filepath.Join(dir, "data"), runAs: s.runAs, durable: s.durable}
	if st.runAs != nil {
		if err := os.Chown(dir, int(st.runAs.Uid), int(st.runAs.Gid)); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
	}
	// -R writes standby.signal and primary_conninfo; -c fast does not wait for the next
	// checkpoint; -X stream copies the WAL written meanwhile.
	source := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=%s", s.port, name)
	if err := st.run("pg_basebackup", "-d", source, "-D", st.dataDir, "-X", "stream", "-R", "-c", "fast", "--no-sync"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pgcluster: base backup for standby %s: %w", name, err)
	}
	port, err := freePort()
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	settings := []string{
		"-c listen_addresses=127.0.0.1",
		"-c port=" + strconv.Itoa(port),
		"-c unix_socket_directories=" + dir,
		"-c max_connections=300",
		"-c hot_standby=on",
		"-c cluster_name=" + name,
	}
	if !st.durable {
		settings = append(settings, "-c fsync=off")
	}
	settings = append(settings, primarySettings...)
	st.opts = strings.Join(settings, " ")
	if err := st.Resume(); err != nil {
		st.Stop()
		return nil, fmt.Errorf("pgcluster: start standby %s: %w (log: %s)", name, err, filepath.Join(dir, "postgres.log"))
	}
	st.port = port
	st.adminDSN = fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", port)
	return st, nil
}

// Promote makes a standby a primary (pg_ctl promote) and waits until it accepts writes.
func (s *Server) Promote() error {
	if s.dataDir == "" {
		return errors.New("pgcluster: only a throwaway standby can be promoted")
	}
	return s.run("pg_ctl", "promote", "-w", "-t", "60", "-D", s.dataDir)
}

// Crash kills every process of the cluster at once (SIGKILL), as a machine that loses power
// would stop them: nothing is flushed or sent to the standbys beyond what already was. The data
// directory stays, with a stale postmaster.pid removed so that Stop only removes it.
func (s *Server) Crash() error {
	if err := s.signalAll(syscall.SIGKILL); err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.dataDir, "postmaster.pid")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// FreezeWALReceiver stops a standby's WAL receiver (SIGSTOP) and returns a function that lets
// it run again: meanwhile the standby reads nothing more, and its primary's WAL waits in the
// socket's buffers or in the primary. With a synchronous standby, the primary's commits wait.
func (s *Server) FreezeWALReceiver() (thaw func() error, err error) { return s.freeze("walreceiver") }

// FreezeWALSenders stops a primary's WAL senders (SIGSTOP) and returns a function that lets them
// run again: meanwhile the standbys receive nothing, and fall behind as across a slow link; what
// the primary writes meanwhile is lost to them if it crashes. With a synchronous standby, the
// primary's commits wait.
func (s *Server) FreezeWALSenders() (thaw func() error, err error) { return s.freeze("walsender") }

// freeze stops the cluster's processes whose command line names kind.
func (s *Server) freeze(kind string) (thaw func() error, err error) {
	procs, err := s.processes()
	if err != nil {
		return nil, err
	}
	var frozen []int
	thaw = func() error {
		var errs []error
		for _, pid := range frozen {
			if err := syscall.Kill(pid, syscall.SIGCONT); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	for pid := range procs {
		cmdline, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), kind) {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
			thaw()
			return nil, fmt.Errorf("pgcluster: freeze the %s: %w", kind, err)
		}
		frozen = append(frozen, pid)
	}
	if len(frozen) == 0 {
		return nil, fmt.Errorf("pgcluster: no %s process is running", kind)
	}
	return thaw, nil
}

// MultiHostDSN returns a data source that names every server given, in order, on 127.0.0.1,
// for the database db, with target_session_attrs=read-write: pgx and libpq try each host in
// turn and keep the first that accepts writes, so that clients follow a promotion.
func MultiHostDSN(db string, servers ...*Server) string {
	hosts := make([]string, len(servers))
	ports := make([]string, len(servers))
	for i, s := range servers {
		hosts[i], ports[i] = "127.0.0.1", strconv.Itoa(s.port)
	}
	return fmt.Sprintf("host=%s port=%s user=postgres dbname=%s sslmode=disable target_session_attrs=read-write",
		strings.Join(hosts, ","), strings.Join(ports, ","), db)
}

// DatabaseName returns the name of the database in a data source CreateDatabase returned.
func DatabaseName(dsn string) string {
	fields := strings.Fields(dsn)
	for i := len(fields) - 1; i >= 0; i-- {
		if name, ok := strings.CutPrefix(fields[i], "dbname="); ok {
			return name
		}
	}
	return ""
}
