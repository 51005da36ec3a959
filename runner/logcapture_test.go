package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// logLine is one captured log record with its attributes as text.
type logLine struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

func (l logLine) String() string { return fmt.Sprintf("%v %q %v", l.Level, l.Msg, l.Attrs) }

// logCapture records every log line of the loggers made from it (and
// writes them to the test output).
type logCapture struct {
	mu    sync.Mutex
	lines []logLine
}

// logger returns a logger recording into lc and writing to t's output.
func (lc *logCapture) logger(t *testing.T) *slog.Logger {
	return slog.New(&captureHandler{lc: lc, next: slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo})})
}

// find returns the lines at level whose message contains msg and whose
// attributes include every key=value of attrs.
func (lc *logCapture) find(level slog.Level, msg string, attrs ...string) []logLine {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	var out []logLine
next:
	for _, l := range lc.lines {
		if l.Level != level || !strings.Contains(l.Msg, msg) {
			continue
		}
		for i := 0; i+1 < len(attrs); i += 2 {
			if l.Attrs[attrs[i]] != attrs[i+1] {
				continue next
			}
		}
		out = append(out, l)
	}
	return out
}

func (lc *logCapture) all() []logLine {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return append([]logLine(nil), lc.lines...)
}

type captureHandler struct {
	lc    *logCapture
	attrs []slog.Attr
	next  slog.Handler
}

func (h *captureHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *captureHandler) Handle(ctx context.Context, r slog.Record) error {
	l := logLine{Level: r.Level, Msg: r.Message, Attrs: map[string]string{}}
	for _, a := range h.attrs {
		l.Attrs[a.Key] = a.Value.String()
	}
	r.Attrs(func(a slog.Attr) bool {
		l.Attrs[a.Key] = a.Value.String()
		return true
	})
	h.lc.mu.Lock()
	h.lc.lines = append(h.lc.lines, l)
	h.lc.mu.Unlock()
	if h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h *captureHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return &captureHandler{lc: h.lc, attrs: append(append([]slog.Attr(nil), h.attrs...), as...), next: h.next.WithAttrs(as)}
}

func (h *captureHandler) WithGroup(name string) slog.Handler {
	return &captureHandler{lc: h.lc, attrs: h.attrs, next: h.next.WithGroup(name)}
}
