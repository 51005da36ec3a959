package runner_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/runner/internal/tracing"
	"github.com/shardhost/shardhost/storage/memory"
)

// spanAttrTable returns the span attributes a table documents, with the
// spans it says carry them.
func spanAttrTable(t *testing.T, text string, row *regexp.Regexp) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(text, -1) {
		if _, dup := out[m[1]]; dup {
			t.Errorf("span attribute %s documented twice", m[1])
		}
		out[m[1]] = m[2]
	}
	return out
}

// TestSpanAttributesDocumented: every span attribute key of the runner's
// spans (tracing.Keys, and every key found on the spans and events of a
// traced ask, signal and timer tick) is in the table of
// docs/observability.md — the one place they are documented — which lists
// no key that does not exist; the lifecycle spans are named there, and
// every span event in docs/tracing.md.
func TestSpanAttributesDocumented(t *testing.T) {
	const where = "docs/observability.md"
	obs := string(readDoc(t, where))
	doc := spanAttrTable(t, obs, regexp.MustCompile("(?m)^\\| `((?:rpc|server|error|shardhost)\\.[a-z_.]+)` \\| ([a-z, ]+) \\|"))
	known := map[string]bool{}
	for _, k := range tracing.Keys {
		known[string(k)] = true
	}
	// The keys spans actually carry.
	c := memory.NewCluster()
	defer c.Close()
	s := newSpans(t)
	r := startTraced(t, c, s, runner.Config{ID: "a", NumShards: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := traceeRelay.Ask(ctx, r, "doc", relayReq{To: "doc2"}); err != nil {
		t.Fatal(err)
	}
	if _, err := traceeRelay.Ask(ctx, r, "doc", relayReq{Panic: true}); err == nil {
		t.Fatal("a panicking handler's ask succeeded")
	}
	if err := traceeArm.Tell(ctx, r, "doc", traceArmReq{}); err != nil {
		t.Fatal(err)
	}
	<-traceeEnvs.ticks
	keysKnown(t, s.ended())
	if len(doc) < len(known) {
		t.Errorf("%s documents %d attributes, want %d", where, len(doc), len(known))
	}
	for k := range known {
		if _, ok := doc[k]; !ok {
			t.Errorf("%s: span attribute %s is not documented", where, k)
		}
	}
	for k := range doc {
		if !known[k] {
			t.Errorf("%s documents span attribute %s, which no span carries", where, k)
		}
	}
	// The lifecycle spans (their keys are checked by keysKnown in the
	// tests that make them: TestHandoffTracedOnBothSides and others) and
	// every event.
	for _, name := range tracing.LifecycleSpans {
		if !strings.Contains(obs, "`"+name+"`") && !strings.Contains(obs, `"`+name+`"`) {
			t.Errorf("%s does not name the span %q", where, name)
		}
	}
	spans := strings.Join(strings.Fields(string(readDoc(t, "docs/tracing.md"))), " ")
	for _, ev := range tracing.Events {
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(ev) + `\b`).MatchString(spans) {
			t.Errorf("docs/tracing.md does not name the event %s", ev)
		}
	}
}

// keysKnown checks that every attribute key of the spans sps and their
// events is in tracing.Keys (which TestSpanAttributesDocumented checks
// against the documentation).
func keysKnown(t *testing.T, sps []sdktrace.ReadOnlySpan) {
	t.Helper()
	known := map[string]bool{}
	for _, k := range tracing.Keys {
		known[string(k)] = true
	}
	for k := range spanKeys(sps) {
		if !known[k] {
			t.Errorf("spans carry %s, which is not in tracing.Keys", k)
		}
	}
}
