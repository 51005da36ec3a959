package testenv

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
)

// WarnLines is a [slog.Handler] that records the lines at WARN and above
// as text: the message, then " key=value" for each attribute of the
// record (those of Logger.With are not kept). Safe for concurrent use.
type WarnLines struct {
	mu    sync.Mutex
	lines []string
}

// Enabled implements slog.Handler: WARN and above.
func (l *WarnLines) Enabled(_ context.Context, lv slog.Level) bool { return lv >= slog.LevelWarn }

// Handle implements slog.Handler.
func (l *WarnLines) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.Key + "=" + a.Value.String())
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, b.String())
	l.mu.Unlock()
	return nil
}

// WithAttrs implements slog.Handler (the attributes are not kept).
func (l *WarnLines) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler.
func (l *WarnLines) WithGroup(string) slog.Handler { return l }

// Find returns the lines holding every one of parts, in order.
func (l *WarnLines) Find(parts ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, line := range l.lines {
		for _, p := range parts {
			if !strings.Contains(line, p) {
				continue next
			}
		}
		out = append(out, line)
	}
	return out
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers (a logger's
// output that a test reads while runners write it).
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write implements io.Writer.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
