//go:build linux

package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
)

// exportedSpan is a span as -traces writes it (stdouttrace's JSON).
type exportedSpan struct {
	Name        string
	SpanContext struct{ TraceID, SpanID string }
	Parent      struct{ TraceID, SpanID string }
	SpanKind    int // trace.SpanKind: 1 internal, 2 server, 3 client
	Attributes  []keyValue
	Resource    []keyValue
	proc        string // the file it came from
}

type keyValue struct {
	Key   string
	Value struct{ Value any }
}

func (s exportedSpan) attr(key string) string { return lookup(s.Attributes, key) }

func (s exportedSpan) resource(key string) string { return lookup(s.Resource, key) }

func lookup(kvs []keyValue, key string) string {
	for _, kv := range kvs {
		if kv.Key == key {
			return fmt.Sprint(kv.Value.Value)
		}
	}
	return ""
}

// readSpans reads the spans a process exported to file.
func readSpans(t *testing.T, file, proc string) []exportedSpan {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []exportedSpan
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var s exportedSpan
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			t.Fatalf("%s: %v: %s", file, err, sc.Bytes())
		}
		s.proc = proc
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestClusterTracesCrossProcesses runs the gateway and two runners as
// processes, each exporting every span to its own file (-traces,
// -trace-ratio 1), the gateway sending plain asks and relays: each ask
// the gateway sent is one trace spanning two processes — the gateway's
// client span, the server span of the runner that served it (its child,
// in that runner's file) and the handler's span (the server span's child)
// — and each relay whose target the gateway found on the other runner is
// one trace across all three processes' files: the gateway's client span
// -> runner A's server span -> its handler's span -> the client span of
// the handler's own ask -> runner B's server span -> B's handler's span.
// The other traces are the runners' own work, each an internal root span
// on a runner: the shards moving when a runner stops gracefully (the
// first SIGTERMed hands its shards to the other), whose "handoff release"
// on one runner and "handoff warm" on the other name each other (peer
// and epochs) across the two files.
func TestClusterTracesCrossProcesses(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	dir := t.TempDir()
	bin := goBuild(t, "cluster", ".")
	ids := []string{"runner-1", "runner-2"}
	common := []string{"-etcd", etcd.Endpoint(), "-namespace", "traced", "-shards", "64", "-trace-ratio", "1"}
	debug := map[string]string{}
	procs := map[string]*proc{}
	files := map[string]string{}
	for _, id := range append(ids, "gateway") {
		addr := testenv.FreeAddr(t)
		debug[id] = "http://" + addr + DebugPath
		files[id] = filepath.Join(dir, "spans-"+id+".jsonl")
		args := append([]string{"-id", id, "-debug", addr, "-traces", files[id]}, common...)
		if id == "gateway" {
			args = append(args, "-role", "gateway", "-rate", "40", "-relay-ratio", "0.5", "-entities", "200", "-report", "500ms")
		} else {
			args = append(args, "-role", "runner")
		}
		procs[id] = start(t, dir, bin, id, args...)
	}
	waitState(t, debug["gateway"], 60*time.Second, "2 attached runners owning every shard, seen by the gateway", healthy(ids...))
	waitState(t, debug["runner-1"], 20*time.Second, "traffic handled on every runner", func(st runner.DebugState) bool {
		for _, r := range st.Runners {
			if r.State == nil || r.State.Messages < 30 {
				return false
			}
		}
		return healthy(ids...)(st)
	})
	// The gateway counts the relays served by two runners in its lines.
	const minRelays = 15
	for deadline := time.Now().Add(20 * time.Second); relaysAcross(t, procs["gateway"].log) < minRelays; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the gateway reported %d relays across two runners in 20 s, want %d", relaysAcross(t, procs["gateway"].log), minRelays)
		}
	}
	// Stop gracefully: each process flushes its spans as it exits.
	for _, id := range append([]string{"gateway"}, ids...) {
		p := procs[id]
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s did not stop within 30 s of SIGTERM", id)
		}
	}

	byTrace := map[string][]exportedSpan{}
	for _, id := range append(ids, "gateway") {
		for _, s := range readSpans(t, files[id], id) {
			if got := s.resource("service.instance.id"); got != id {
				t.Errorf("%s: span %q with service.instance.id %q", files[id], s.Name, got)
			}
			byTrace[s.SpanContext.TraceID] = append(byTrace[s.SpanContext.TraceID], s)
		}
	}
	asks, relays, local, served := 0, 0, 0, map[string]int{}
	lifecycle := map[string][]*exportedSpan{} // by span name
	for id, spans := range byTrace {
		tr := newSpanTree(spans)
		var roots []*exportedSpan
		for i, s := range spans {
			if s.Parent.SpanID == "0000000000000000" {
				roots = append(roots, &spans[i])
			}
		}
		if len(roots) == 1 && lifecycleSpans[roots[0].Name] {
			// A runner's own work (a shard moving at a graceful stop): a
			// trace of its own, on a runner, no request's.
			if r := roots[0]; r.proc == "gateway" || r.SpanKind != 1 {
				t.Errorf("trace %s: lifecycle span %q on %s of kind %d, want an internal span on a runner", id, r.Name, r.proc, r.SpanKind)
			}
			lifecycle[roots[0].Name] = append(lifecycle[roots[0].Name], roots[0])
			continue
		}
		if len(roots) != 1 || roots[0].proc != "gateway" || roots[0].SpanKind != 3 {
			t.Errorf("trace %s: roots %v, want one: the gateway's client span", id, names(roots))
			continue
		}
		client := roots[0]
		if client.attr("rpc.system") != "shardhost" || (client.Name != "counter/inc" && client.Name != "counter/relay") {
			t.Errorf("trace %s: the gateway's root span is %q with rpc.system %q", id, client.Name, client.attr("rpc.system"))
		}
		if client.attr("error.type") != "" {
			continue // a failed ask (none expected; the gateway's log counts them)
		}
		handler := tr.served(t, id, client)
		if handler == nil {
			continue
		}
		if client.Name == "counter/inc" {
			asks++
			served[handler.proc]++
			continue
		}
		// A relay: the handler's own ask is a client span, its child, in
		// the same process, served where the target lives.
		var inner *exportedSpan
		for _, c := range tr.children[handler.SpanContext.SpanID] {
			if c.SpanKind == 3 {
				inner = c
			}
		}
		if inner == nil || inner.Name != "counter/inc" || inner.proc != handler.proc {
			t.Errorf("trace %s: the relay's handler %s on %s has no client span counter/inc as a child in its process (spans %v)", id, handler.Name, handler.proc, names(tr.all))
			continue
		}
		second := tr.served(t, id, inner)
		if second == nil {
			continue
		}
		if second.proc == handler.proc {
			local++ // the gateway found no target on the other runner (before it knew the shards' owners)
			continue
		}
		if procs := tr.procs(); len(procs) != 3 {
			t.Errorf("trace %s: a relay served by %s then %s has spans from %v, want the 3 processes", id, handler.proc, second.proc, procs)
		}
		relays++
	}
	t.Logf("%d traces: %d asks across two processes (served by %v), %d relays across three, %d relays on one runner; lifecycle: %d handoff warm, %d handoff release",
		len(byTrace), asks, served, relays, local, len(lifecycle["handoff warm"]), len(lifecycle["handoff release"]))
	checkHandoffSides(t, lifecycle["handoff warm"], lifecycle["handoff release"])
	if asks < 10 || served["runner-1"] == 0 || served["runner-2"] == 0 {
		t.Errorf("%d asks traced across processes, served by %v: want at least 10, on both runners", asks, served)
	}
	if relays < minRelays {
		t.Errorf("%d relays traced across the three processes, want at least the %d the gateway reported", relays, minRelays)
	}

	// The waterfall of these files draws a relay across the three
	// processes by default, every span of its trace a row.
	page := filepath.Join(dir, "trace.html")
	wf := goBuild(t, "waterfall", "./waterfall")
	if out, err := exec.Command(wf, "-o", page, files["gateway"], files["runner-1"], files["runner-2"]).CombinedOutput(); err != nil {
		t.Fatalf("waterfall: %v\n%s", err, out)
	} else {
		t.Logf("waterfall: %s", bytes.TrimSpace(out))
	}
	doc, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	rows := waterfallRows(t, doc)
	if len(rows) == 0 {
		t.Fatalf("%s: no rows", page)
	}
	drawn := byTrace[traceOf(byTrace, rows[0].span)]
	drawnBy := map[string]bool{}
	for _, r := range rows {
		drawnBy[r.process] = true
	}
	if len(rows) != len(drawn) || len(drawnBy) != 3 || rows[0].name != "counter/relay" {
		t.Errorf("the waterfall drew %d rows from %d processes, first %q; want the %d spans of a relay across the 3 processes", len(rows), len(drawnBy), rows[0].name, len(drawn))
	}
	if dir := os.Getenv("SHARDHOST_SCREENSHOTS"); dir != "" {
		if b := testenv.TryChromium(t); b != nil {
			b.Screenshot("file://"+page, filepath.Join(dir, "trace-waterfall.png"), 1280, 440+22*len(rows), time.Second)
		}
	}
}

// waterfallRow is a row of a waterfall page, as its SVG has it.
type waterfallRow struct{ span, parent, name, process string }

// waterfallRows parses the rows of a waterfall page, in order.
func waterfallRows(t *testing.T, page []byte) []waterfallRow {
	t.Helper()
	doc, err := html.Parse(bytes.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	var rows []waterfallRow
	for n := range doc.Descendants() {
		if n.Type == html.ElementNode && n.Data == "g" && attrOf(n, "class") == "row" {
			r := waterfallRow{span: attrOf(n, "data-span-id"), parent: attrOf(n, "data-parent-id"), process: attrOf(n, "data-process")}
			for c := range n.Descendants() {
				if c.Type == html.ElementNode && c.Data == "tspan" && attrOf(c, "class") == "label" {
					r.name = textOf(c)
				}
			}
			rows = append(rows, r)
		}
	}
	return rows
}

func textOf(n *html.Node) string {
	var b strings.Builder
	for c := range n.Descendants() {
		if c.Type == html.TextNode {
			b.WriteString(c.Data)
		}
	}
	return b.String()
}

// traceOf returns the trace of span ID id.
func traceOf(byTrace map[string][]exportedSpan, id string) string {
	for tr, spans := range byTrace {
		for _, s := range spans {
			if s.SpanContext.SpanID == id {
				return tr
			}
		}
	}
	return ""
}

// relaysAcross sums the relays across two runners that the gateway's
// traffic lines in log report.
func relaysAcross(t *testing.T, log string) int {
	t.Helper()
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range relayLine.FindAllSubmatch(b, -1) {
		k, _ := strconv.Atoi(string(m[1]))
		n += k
	}
	return n
}

var relayLine = regexp.MustCompile(`relays \((\d+) across two runners\)`)

// spanTree is one trace's spans by parent.
type spanTree struct {
	all      []*exportedSpan
	children map[string][]*exportedSpan // by parent span ID
}

func newSpanTree(spans []exportedSpan) spanTree {
	tr := spanTree{children: map[string][]*exportedSpan{}}
	for i := range spans {
		s := &spans[i]
		tr.all = append(tr.all, s)
		tr.children[s.Parent.SpanID] = append(tr.children[s.Parent.SpanID], s)
	}
	return tr
}

// procs returns the processes whose files hold the trace's spans.
func (tr spanTree) procs() []string {
	var out []string
	for _, s := range tr.all {
		if !slices.Contains(out, s.proc) {
			out = append(out, s.proc)
		}
	}
	slices.Sort(out)
	return out
}

// served checks the spans under client span c, an ask that succeeded: each
// attempt that reached another runner is a server span, c's child, in
// another process than c's; the handler's span ("handle " + c's name) is
// the child of the last one's, in the same process — or, for an ask the
// runner of c served itself, c's own child. It returns the handler's span,
// or nil (with an error reported) when the links are not so.
func (tr spanTree) served(t *testing.T, trace string, c *exportedSpan) *exportedSpan {
	t.Helper()
	want := "handle " + c.Name
	var handler *exportedSpan
	for _, k := range tr.children[c.SpanContext.SpanID] {
		switch {
		case k.SpanKind == 2 && k.proc == c.proc:
			t.Errorf("trace %s: server span %s in the process of its client span %s (%s)", trace, k.Name, c.Name, c.proc)
		case k.SpanKind == 2:
			for _, h := range tr.children[k.SpanContext.SpanID] {
				if h.SpanKind == 1 && h.Name == want && h.proc == k.proc {
					handler = h
				}
			}
		case k.SpanKind == 1 && k.Name == want && k.proc == c.proc:
			handler = k // served locally
		}
	}
	if handler == nil {
		t.Errorf("trace %s: no span %q under client span %s on %s (spans %v)", trace, want, c.Name, c.proc, names(tr.all))
	}
	return handler
}

func names(spans []*exportedSpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, fmt.Sprintf("%s(%s, kind %d, %s <- %s)", s.Name, s.proc, s.SpanKind, s.SpanContext.SpanID, s.Parent.SpanID))
	}
	return out
}

// lifecycleSpans are the names of the root spans a runner records for its
// own work (docs/tracing.md).
var lifecycleSpans = map[string]bool{"handoff warm": true, "handoff release": true, "detach": true, "reattach": true}

// checkHandoffSides checks the handoffs traced in two processes against
// each other: a shard released by cutover on one runner was warmed on the
// other, and the two spans name each other's epochs (the release's peer
// epoch is the epoch the new owner got; the warm span's peer epoch is the
// one released).
func checkHandoffSides(t *testing.T, warms, releases []*exportedSpan) {
	t.Helper()
	type key struct{ shard, epoch string }
	warmed := map[key]*exportedSpan{}
	for _, w := range warms {
		if w.attr("shardhost.outcome") == "cutover" {
			warmed[key{w.attr("shardhost.shard"), w.attr("shardhost.epoch")}] = w
		}
	}
	for _, r := range releases {
		if r.attr("shardhost.outcome") != "cutover" {
			continue
		}
		w := warmed[key{r.attr("shardhost.shard"), r.attr("shardhost.peer.epoch")}]
		switch {
		case w == nil:
			t.Errorf("shard %s released by cutover on %s to %s at epoch %s: no handoff warm span of that shard and epoch",
				r.attr("shardhost.shard"), r.proc, r.attr("shardhost.peer"), r.attr("shardhost.peer.epoch"))
		case w.proc == r.proc || w.proc != r.attr("shardhost.peer") || w.attr("shardhost.peer") != r.proc || w.attr("shardhost.peer.epoch") != r.attr("shardhost.epoch"):
			t.Errorf("shard %s: release on %s (peer %s, epoch %s) and warm on %s (peer %s, peer epoch %s) do not name each other",
				r.attr("shardhost.shard"), r.proc, r.attr("shardhost.peer"), r.attr("shardhost.epoch"), w.proc, w.attr("shardhost.peer"), w.attr("shardhost.peer.epoch"))
		}
	}
}
