package kafkacluster

// A node's process: started, killed, stopped, frozen and thawed by signals, as the fault
// scenarios need.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Start starts the node's process (again, after Kill or Terminate, with the same data and ports).
// It returns once the process runs, not once the node serves: see Cluster.WaitReady.
func (n *Node) Start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		return fmt.Errorf("kafkacluster: node %d is running", n.ID)
	}
	logFile, err := os.OpenFile(n.LogPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("kafkacluster: %w", err)
	}
	args := append(slices.Clone(jvmOptions),
		"-Dlog4j2.configurationFile="+filepath.Join(n.dir, "log4j2.properties"),
		"-cp", filepath.Join(n.jars, "*"), "kafka.Kafka", filepath.Join(n.dir, "server.properties"))
	cmd := exec.Command("java", args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// The node dies with the test binary, even one killed by a test timeout.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return fmt.Errorf("kafkacluster: start node %d: %w", n.ID, err)
	}
	exited := make(chan struct{})
	go func() {
		cmd.Wait()
		logFile.Close()
		close(exited)
	}()
	n.cmd, n.exited, n.frozen = cmd, exited, false
	return nil
}

// Kill ends the node at once (SIGKILL), as a crash would. A node not running is left as it is.
func (n *Node) Kill() { n.stop(syscall.SIGKILL, 0) }

// Terminate stops the node as an operator would (SIGTERM: a controlled shutdown that hands its
// partitions' leadership over first), waiting up to timeout before killing it.
func (n *Node) Terminate(timeout time.Duration) { n.stop(syscall.SIGTERM, timeout) }

func (n *Node) stop(sig syscall.Signal, timeout time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return
	}
	if n.frozen && sig != syscall.SIGKILL {
		n.cmd.Process.Signal(syscall.SIGCONT)
	}
	n.cmd.Process.Signal(sig)
	select {
	case <-n.exited:
	case <-time.After(timeout):
		n.cmd.Process.Kill()
		<-n.exited
	}
	n.cmd, n.frozen = nil, false
}

// Freeze suspends the node (SIGSTOP): its connections stay open and nothing answers, as with a
// broker in a long GC pause or on a host that stopped.
func (n *Node) Freeze() { n.signal(syscall.SIGSTOP, true) }

// Thaw resumes a frozen node.
func (n *Node) Thaw() { n.signal(syscall.SIGCONT, false) }

func (n *Node) signal(sig syscall.Signal, frozen bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd != nil {
		n.cmd.Process.Signal(sig)
		n.frozen = frozen
	}
}

// Running reports whether the node's process runs (frozen or not).
func (n *Node) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cmd != nil
}

// PID is the node's process ID, or 0 when it is not running.
func (n *Node) PID() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// FencedAt returns when the controller fenced node id, the first time after after, from the
// nodes' logs: the moment a crashed broker leaves the in-sync replicas and its partitions and
// coordinators move (broker.session.timeout.ms after its last heartbeat to the controller, which
// checks every eighth of that). ok is false if no node logged it. The log's times are the
// machine's local time, as the brokers run on the machine that reads them.
func (c *Cluster) FencedAt(id int, after time.Time) (at time.Time, ok bool) {
	needle := fmt.Sprintf("Fencing broker %d at epoch", id)
	for _, n := range c.nodes {
		data, err := os.ReadFile(n.LogPath())
		if err != nil {
			continue
		}
		for line := range strings.Lines(string(data)) {
			// [2026-11-27 07:51:27,381] INFO [QuorumController id=2] Fencing broker 1 at epoch 10 ...
			if !strings.Contains(line, needle) || len(line) < 25 || line[0] != '[' {
				continue
			}
			t, err := time.ParseInLocation("2006-01-02 15:04:05,000", line[1:24], time.Local)
			if err == nil && t.After(after) && (!ok || t.Before(at)) {
				at, ok = t, true
			}
		}
	}
	return at, ok
}
