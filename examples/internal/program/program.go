// Package program runs the example programs as a user does, for their tests: built with go build
// (without cgo, as their doc comments promise), started as processes whose output a test watches,
// and stopped with SIGINT. Tests only import it.
package program

import (
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

// Build builds the main package pkg (an import path) with CGO_ENABLED=0 into a directory of the
// test's, and returns the binary's path.
func Build(tb testing.TB, pkg string) string {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), filepath.Base(pkg))
	build := exec.Command("go", "build", "-o", bin, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		tb.Fatalf("CGO_ENABLED=0 go build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

// Process is a running program.
type Process struct {
	name   string
	cmd    *exec.Cmd
	out    syncbuf.Buffer // standard output and error
	exited chan struct{}
	err    error // Wait's, once exited is closed
}

// Start starts the program at bin with args. If the test ends with it still running, it is
// killed; if the test failed, its output is logged.
func Start(tb testing.TB, bin string, args ...string) *Process {
	tb.Helper()
	p := &Process{name: filepath.Base(bin), cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	tb.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			p.cmd.Process.Kill()
			<-p.exited
		}
		if tb.Failed() {
			tb.Logf("%s's output:\n%s", p.name, p.out.String())
		}
	})
	return p
}

// Output returns what the program has written so far.
func (p *Process) Output() string { return p.out.String() }

// Await waits up to within for the program's output to match re, and returns the match and its
// submatches. It fails the test if the program exits first or the time passes.
func (p *Process) Await(tb testing.TB, within time.Duration, re *regexp.Regexp) []string {
	tb.Helper()
	var m []string
	exited := false
	testwait.For(tb, within, p.name+" to print "+re.String(), func() bool {
		if m = re.FindStringSubmatch(p.out.String()); m != nil {
			return true
		}
		select {
		case <-p.exited:
			exited = true
			return true
		default:
			return false
		}
	})
	if m == nil && exited {
		tb.Fatalf("%s exited (%v) without printing %s", p.name, p.err, re)
	}
	return m
}

// Interrupt sends the program SIGINT, as Ctrl-C does, and fails the test unless it exits with
// status 0 within the given time.
func (p *Process) Interrupt(tb testing.TB, within time.Duration) {
	tb.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		tb.Fatalf("%s: SIGINT: %v", p.name, err)
	}
	select {
	case <-p.exited:
	case <-time.After(within):
		tb.Fatalf("%s did not exit within %v of SIGINT", p.name, within)
	}
	if p.err != nil {
		tb.Fatalf("%s exited with %v after SIGINT, want status 0", p.name, p.err)
	}
}

// TakingOrders is what an order service (examples/stasher, examples/mysqlstasher) prints once it
// takes orders; its submatch is the address.
var TakingOrders = regexp.MustCompile(`taking orders.* address=(\S+)`)

// StartOrderService builds the order service pkg, starts it on the database dsn and a loopback
// port of its choosing, waits until it takes orders, and returns it and the address it serves on.
func StartOrderService(tb testing.TB, pkg, dsn string) (*Process, string) {
	tb.Helper()
	p := Start(tb, Build(tb, pkg), "-dsn", dsn, "-addr", "127.0.0.1:0")
	return p, p.Await(tb, time.Minute, TakingOrders)[1]
}

// PlaceOrders places order 42, then order 42 again, then order "forty-three", with the order
// service at addr, and fails the test unless it answers 201 Created, 409 Conflict and 400 Bad
// Request. The service's tables should then hold order 42 and the one message announcing it.
func PlaceOrders(tb testing.TB, addr string) {
	tb.Helper()
	for _, c := range []struct {
		path string
		want int
	}{
		{"/orders/42", http.StatusCreated},
		{"/orders/42", http.StatusConflict},
		{"/orders/forty-three", http.StatusBadRequest},
	} {
		if got, body := Post(tb, "http://"+addr+c.path); got != c.want {
			tb.Errorf("POST %s: %d %s, want %d", c.path, got, body, c.want)
		}
	}
}

// Post sends an empty POST request to url and returns the response's status and body. It keeps no
// connection open afterwards.
func Post(tb testing.TB, url string) (int, string) {
	tb.Helper()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: time.Minute}
	resp, err := client.Post(url, "", nil)
	if err != nil {
		tb.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("POST %s: %v", url, err)
	}
	return resp.StatusCode, string(body)
}
