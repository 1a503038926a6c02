package rdlog

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"

	"github.com/goharvest/goharvest/internal/testkit/syncbuf"
	"github.com/goharvest/goharvest/internal/testkit/testwait"
)

func TestLevel(t *testing.T) {
	want := map[int]slog.Level{0: slog.LevelError, 3: slog.LevelError, 4: slog.LevelWarn, 5: slog.LevelInfo, 6: slog.LevelDebug, 7: slog.LevelDebug}
	for syslog, level := range want {
		if got := Level(syslog); got != level {
			t.Errorf("Level(%d) = %v, want %v", syslog, got, level)
		}
	}
}

func TestForwardGoesThroughTheLogger(t *testing.T) {
	var buf syncbuf.Buffer
	cm := kafka.ConfigMap{"bootstrap.servers": "127.0.0.1:1", "debug": "generic"}
	Enable(cm)
	p, err := kafka.NewProducer(&cm)
	if err != nil {
		t.Fatal(err)
	}
	Forward(p.Logs(), slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	testwait.Until(5*time.Second, func() bool { return strings.Contains(buf.String(), "librdkafka=") })
	p.Close()
	if !strings.Contains(buf.String(), "librdkafka=") {
		t.Fatalf("no librdkafka line reached the logger: %q", buf.String())
	}
}
