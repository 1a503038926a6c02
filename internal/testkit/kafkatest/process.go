package kafkatest

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// envChild tells a re-executed test binary to serve as a broker; its value lists the topics to
// seed, as "name:partitions,name:partitions".
const envChild = "GOHARVEST_KAFKATEST_CHILD"

// ServeIfChild turns this process into a broker when a parent started it with StartProcess, and
// exits once the parent closes its standard input. Packages that use StartProcess call it first
// thing in TestMain.
func ServeIfChild() {
	spec, ok := os.LookupEnv(envChild)
	if !ok {
		return
	}
	opts := []kfake.Opt{kfake.NumBrokers(1), kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1),
		kfake.GroupMinSessionTimeout(100 * time.Millisecond)}
	for _, t := range strings.Split(spec, ",") {
		if name, parts, ok := strings.Cut(t, ":"); ok {
			n, _ := strconv.Atoi(parts)
			opts = append(opts, kfake.SeedTopics(int32(n), name))
		}
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Println(c.ListenAddrs()[0])
	io.Copy(io.Discard, os.Stdin)
	c.Close()
	os.Exit(0)
}

// Process is a broker running in a child process, so that its CPU is not counted as the
// test's own.
type Process struct {
	Addr string
	Cmd  *exec.Cmd
}

// StartProcess starts a broker in a child process (this test binary, re-executed; see
// ServeIfChild) seeded with the given topics and partition counts. It is stopped when the test
// ends.
func StartProcess(tb testing.TB, topics map[string]int32) *Process {
	tb.Helper()
	var spec []string
	for name, parts := range topics {
		spec = append(spec, fmt.Sprintf("%s:%d", name, parts))
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"="+strings.Join(spec, ","))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || strings.HasPrefix(line, "error:") {
		tb.Fatalf("kafkatest: broker process: %q %v", line, err)
	}
	return &Process{Addr: strings.TrimSpace(line), Cmd: cmd}
}
