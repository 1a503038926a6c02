// Package rdlog sends librdkafka's log lines to a slog.Logger instead of standard error.
package rdlog

import (
	"context"
	"log/slog"

	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
)

// Enable sets the property that makes a client deliver its logs on a channel, unless the
// configuration says otherwise already.
func Enable(cm kafka.ConfigMap) {
	if _, set := cm["go.logs.channel.enable"]; !set {
		cm["go.logs.channel.enable"] = true
	}
}

// Forward logs every event from ch (a client's Logs()) until the client closes it. A nil
// channel (logs not enabled) is ignored.
func Forward(ch chan kafka.LogEvent, logger *slog.Logger) {
	if ch == nil {
		return
	}
	go func() {
		for ev := range ch {
			logger.Log(context.Background(), Level(ev.Level), ev.Message, "librdkafka", ev.Tag, "client", ev.Name)
		}
	}()
}

// Level maps a syslog level, as librdkafka uses, to slog's. librdkafka's notices and
// informational lines (5 and 6) are mostly routine, so only notices stay at Info.
func Level(syslog int) slog.Level {
	switch {
	case syslog <= 3:
		return slog.LevelError
	case syslog == 4:
		return slog.LevelWarn
	case syslog == 5:
		return slog.LevelInfo
	}
	return slog.LevelDebug
}
