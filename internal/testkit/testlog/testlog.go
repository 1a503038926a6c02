// Package testlog is the logger that tests give the harvesters they run: quiet unless asked.
package testlog

import (
	"log/slog"
	"os"
)

// Logger writes to standard error at Warn, or at Debug when GOHARVEST_TEST_DEBUG is set.
func Logger() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("GOHARVEST_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}
