package kafkacluster

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestFencedAtReadsTheControllersLog(t *testing.T) {
	dirs := []string{t.TempDir(), t.TempDir()}
	logs := []string{
		"[2026-11-27 07:51:10,000] INFO [QuorumController id=1] Fencing broker 3 at epoch 9 because its session has timed out.\n" +
			"[2026-11-27 07:51:27,381] INFO [QuorumController id=1] Fencing broker 1 at epoch 10 because its session has timed out.\n",
		"[2026-11-27 07:51:20,000] INFO [QuorumController id=2] Fencing broker 1 at epoch 8 because its session has timed out.\n" +
			"not a log line: Fencing broker 1 at epoch 11\n",
	}
	c := &Cluster{}
	for i, dir := range dirs {
		if err := os.WriteFile(filepath.Join(dir, "server.log"), []byte(logs[i]), 0o644); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, &Node{ID: i + 1, dir: dir})
	}
	after := time.Date(2026, 11, 27, 7, 51, 25, 0, time.Local)
	at, ok := c.FencedAt(1, after)
	if want := time.Date(2026, 11, 27, 7, 51, 27, 381e6, time.Local); !ok || !at.Equal(want) {
		t.Fatalf("FencedAt(1) = %v, %v; want %v", at, ok, want)
	}
	if at, ok := c.FencedAt(1, after.Add(time.Minute)); ok {
		t.Fatalf("FencedAt(1) a minute later = %v; want none", at)
	}
	if at, ok := c.FencedAt(2, time.Time{}); ok {
		t.Fatalf("FencedAt(2) = %v; broker 2 was never fenced", at)
	}
}
