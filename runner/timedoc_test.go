package runner_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestReminderDocsSayExactlyOnceIsTheHandlers: where docs/time.md states
// the reminders' guarantees, it says that exactly-once effects after a
// crash are the handler's job (dedupe by Tick, fenced checkpoint), and the
// example it points at exists and has what it is cited for.
func TestReminderDocsSayExactlyOnceIsTheHandlers(t *testing.T) {
	doc, err := os.ReadFile("../docs/time.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	table := strings.Index(text, "| crash |")
	rule := strings.Index(text, "**Exactly-once effects after a crash are the handler's job.**")
	if table < 0 || rule < table {
		t.Fatalf("docs/time.md: no statement, after the guarantees table, that exactly-once effects after a crash are the handler's job")
	}
	section := text[rule:]
	for _, want := range []string{"Tick", "Redelivered", "fenced checkpoint", "ActivateInfo.Checkpoint", "](../examples/carts/cart.go)"} {
		if !strings.Contains(section, want) {
			t.Errorf("docs/time.md's exactly-once paragraph does not mention %q", want)
		}
	}
	src, err := os.ReadFile("../examples/carts/cart.go")
	if err != nil {
		t.Fatalf("the example docs/time.md points at: %v", err)
	}
	for what, re := range map[string]string{
		"Cart.Expire skips an applied expiry": `func \(c \*Cart\) Expire\(ctx context.Context, t entity.ReminderTick\[int\]\) error \{\n\tif c.Expired`,
		"Summary keeps a fenced checkpoint":   `(?s)func \(s \*Summary\) Activate.*s.save = info.Checkpoint`,
	} {
		if !regexp.MustCompile(re).Match(src) {
			t.Errorf("examples/carts/cart.go no longer shows what docs/time.md cites it for: %s", what)
		}
	}
}
