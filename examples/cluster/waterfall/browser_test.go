package main

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/html"

	"github.com/shardhost/shardhost/internal/testenv"
)

func writeFile(t *testing.T, name, data string) {
	t.Helper()
	if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// exported is a span exportTrace writes: its name, process, kind, times
// (µs after the trace's start) and parent (an index in the list, -1 for
// none).
type exported struct {
	name   string
	proc   string
	kind   trace.SpanKind
	start  int
	end    int
	parent int
	err    bool
}

// relay is a relay across three processes, as the cluster example traces
// it; the inc on runner-2 failed.
var relay = []exported{
	{"counter/relay", "gateway", trace.SpanKindClient, 0, 2000, -1, true},
	{"counter/relay", "runner-1", trace.SpanKindServer, 300, 1900, 0, true},
	{"handle counter/relay", "runner-1", trace.SpanKindInternal, 350, 1850, 1, true},
	{"activate counter", "runner-1", trace.SpanKindInternal, 360, 370, 2, false},
	{"counter/inc", "runner-1", trace.SpanKindClient, 400, 1800, 2, true},
	{"counter/inc", "runner-2", trace.SpanKindServer, 600, 1700, 4, true},
	{"handle counter/inc", "runner-2", trace.SpanKindInternal, 650, 1650, 5, true},
}

// an ask across two processes, exported after the relay.
var ask = []exported{
	{"counter/inc", "gateway", trace.SpanKindClient, 3000, 3500, -1, false},
	{"counter/inc", "runner-1", trace.SpanKindServer, 3100, 3400, 0, false},
	{"handle counter/inc", "runner-1", trace.SpanKindInternal, 3150, 3350, 1, false},
}

var traceStart = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

// exportTrace exports the relay and the ask through OpenTelemetry's SDK
// and stdout exporter, a tracer provider and a file per process (with its
// service.instance.id), as examples/cluster -traces does; it returns the
// files.
func exportTrace(t *testing.T, dir string) []string {
	t.Helper()
	procs := []string{"gateway", "runner-1", "runner-2"}
	tps := map[string]*sdktrace.TracerProvider{}
	var files []string
	for _, p := range procs {
		name := filepath.Join(dir, "spans-"+p+".jsonl")
		f, err := os.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		exp, err := stdouttrace.New(stdouttrace.WithWriter(f))
		if err != nil {
			t.Fatal(err)
		}
		tps[p] = sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
			sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.instance.id", p))))
		files = append(files, name)
	}
	at := func(us int) time.Time { return traceStart.Add(time.Duration(us) * time.Microsecond) }
	for _, tr := range [][]exported{relay, ask} {
		ctxs := make([]context.Context, len(tr))
		spans := make([]trace.Span, len(tr))
		for i, e := range tr {
			ctx := context.Background()
			if e.parent >= 0 {
				ctx = ctxs[e.parent]
			}
			ctxs[i], spans[i] = tps[e.proc].Tracer("test").Start(ctx, e.name, trace.WithSpanKind(e.kind), trace.WithTimestamp(at(e.start)),
				trace.WithAttributes(attribute.String("rpc.system", "shardhost"), attribute.Int("shardhost.shard", 7)))
			if e.err {
				spans[i].AddEvent("shardhost.retry", trace.WithTimestamp(at(e.start+10)), trace.WithAttributes(attribute.Int("shardhost.attempt", 1)))
			}
		}
		for i := len(tr) - 1; i >= 0; i-- { // children end first, as they do
			if tr[i].err && tr[i].proc == "runner-2" {
				spans[i].SetStatus(codes.Error, "handler failed")
				spans[i].SetAttributes(attribute.String("error.type", "handler_error"))
			}
			spans[i].End(trace.WithTimestamp(at(tr[i].end)))
		}
	}
	for _, p := range procs {
		if err := tps[p].Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	return files
}

// TestWaterfallInBrowser draws the spans of a relay across three processes
// (and of an ask across two), exported by OpenTelemetry's stdout exporter,
// and loads the page in headless Chromium: the DOM has one row per span of
// the relay (the default: it crosses the most processes), in parent order
// (each row after its parent, one level deeper, siblings by start), each
// bar drawn where and as wide as its span's times say on the trace's
// axis, a colour per process, the error spans marked, and each row's
// tooltip listing the span's attributes. Skipped without Chromium.
func TestWaterfallInBrowser(t *testing.T) {
	b := testenv.Chromium(t)
	dir := t.TempDir()
	files := exportTrace(t, dir)
	page := filepath.Join(dir, "trace.html")
	var log strings.Builder
	if err := run(append([]string{"-o", page}, files...), &log); err != nil {
		t.Fatal(err)
	}
	t.Log(strings.TrimSpace(log.String()))
	doc, err := html.Parse(strings.NewReader(b.Load("file://"+page, time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	var svg, body *html.Node
	var rows []*html.Node
	for n := range doc.Descendants() {
		switch {
		case n.Type != html.ElementNode:
		case n.Data == "body":
			body = n
		case n.Data == "svg" && attr(n, "id") == "waterfall":
			svg = n
		case n.Data == "g" && attr(n, "class") == "row":
			rows = append(rows, n)
		}
	}
	if svg == nil || body == nil {
		t.Fatal("no svg#waterfall in the page")
	}
	if got := attr(body, "data-drawn"); got != strconv.Itoa(len(relay)) {
		t.Errorf("the page's script measured %s bars, want %d", got, len(relay))
	}
	// The relay's spans, depth first: the order of the list is the one
	// expected, every span following its parent.
	if len(rows) != len(relay) {
		t.Fatalf("%d rows, want the %d spans of the relay", len(rows), len(relay))
	}
	plotX, _ := strconv.ParseFloat(attr(svg, "data-plot-x"), 64)
	plotW, _ := strconv.ParseFloat(attr(svg, "data-plot-width"), 64)
	total := float64(relay[0].end - relay[0].start)
	fill := map[string]string{}
	colours := map[string]bool{}
	for i, r := range rows {
		e := relay[i]
		if name, proc := label(r), attr(r, "data-process"); name != e.name || proc != e.proc {
			t.Errorf("row %d: %s on %s, want %s on %s", i, name, proc, e.name, e.proc)
		}
		depth, _ := strconv.Atoi(attr(r, "data-depth"))
		switch {
		case e.parent < 0 && (attr(r, "data-parent-id") != "" || depth != 0):
			t.Errorf("row %d (%s): parent %q, depth %d; want a root", i, e.name, attr(r, "data-parent-id"), depth)
		case e.parent >= 0 && attr(r, "data-parent-id") != attr(rows[e.parent], "data-span-id"):
			t.Errorf("row %d (%s): parent %s, want row %d's span %s", i, e.name, attr(r, "data-parent-id"), e.parent, attr(rows[e.parent], "data-span-id"))
		case e.parent >= 0 && depth != mustAtoi(attr(rows[e.parent], "data-depth"))+1:
			t.Errorf("row %d (%s): depth %d, want its parent's + 1", i, e.name, depth)
		}
		if got, want := attr(r, "data-duration-ns"), strconv.Itoa((e.end-e.start)*1000); got != want {
			t.Errorf("row %d (%s): duration %s ns, want %s", i, e.name, got, want)
		}
		x, _ := strconv.ParseFloat(attr(r, "data-drawn-x"), 64)
		w, _ := strconv.ParseFloat(attr(r, "data-drawn-width"), 64)
		wantX := plotX + float64(e.start-relay[0].start)/total*plotW
		wantW := max(float64(e.end-e.start)/total*plotW, minBar)
		if math.Abs(x-wantX) > 0.6 || math.Abs(w-wantW) > 0.6 {
			t.Errorf("row %d (%s): bar drawn at x %.2f, %.2f wide; want %.2f, %.2f (%d-%d µs of %v µs on %v px)", i, e.name, x, w, wantX, wantW, e.start, e.end, total, plotW)
		}
		bar := find(r, "rect", "bar")
		errorMarked := bar != nil && strings.Contains(attr(bar, "class"), "error") && attr(r, "data-error") == "true"
		if failed := e.err && e.proc == "runner-2"; errorMarked != failed {
			t.Errorf("row %d (%s on %s): marked as an error %v, want %v", i, e.name, e.proc, errorMarked, failed)
		}
		if bar != nil {
			if f, ok := fill[e.proc]; ok && f != attr(bar, "fill") {
				t.Errorf("row %d: %s's bars in %s and %s, want one colour per process", i, e.proc, f, attr(bar, "fill"))
			}
			fill[e.proc] = attr(bar, "fill")
			colours[attr(bar, "fill")] = true
		}
		tip := text(find(r, "title", ""))
		for _, want := range []string{"rpc.system = shardhost", "shardhost.shard = 7", "on " + e.proc} {
			if !strings.Contains(tip, want) {
				t.Errorf("row %d (%s): tooltip %q lacks %q", i, e.name, tip, want)
			}
		}
		if e.proc == "runner-2" && e.err && (!strings.Contains(tip, "error.type = handler_error") || !strings.Contains(tip, "event shardhost.retry")) {
			t.Errorf("row %d (%s): tooltip %q lacks the error's attribute or the retry event", i, e.name, tip)
		}
	}
	if len(colours) != 3 {
		t.Errorf("bars in %d colours (%v), want 3: one per process", len(colours), fill)
	}
	if shot := os.Getenv("SHARDHOST_WATERFALL_SHOT"); shot != "" { // a look at the test's page, by hand
		b.Screenshot("file://"+page, shot, 1280, 600, time.Second)
	}
}

// TestWaterfallDrawsTheTraceAsked: -trace draws the ask instead of the
// relay, and the page lists the relay among the other traces.
func TestWaterfallDrawsTheTraceAsked(t *testing.T) {
	dir := t.TempDir()
	files := exportTrace(t, dir)
	var spans []Span
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		s, err := readSpans(strings.NewReader(string(b)), filepath.Base(f))
		if err != nil {
			t.Fatal(err)
		}
		spans = append(spans, s...)
	}
	traces := groupTraces(spans)
	if len(traces) != 2 || len(traces[0].Spans) != len(relay) || len(traces[1].Spans) != len(ask) {
		t.Fatalf("%d traces; want the relay then the ask", len(traces))
	}
	page := filepath.Join(dir, "ask.html")
	if err := run(append(files, "-trace", strings.ToUpper(traces[1].ID), "-o", page), &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := html.Parse(strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	listed := false
	for n := range doc.Descendants() {
		if n.Type == html.ElementNode && n.Data == "g" && attr(n, "class") == "row" {
			names = append(names, label(n)+"@"+attr(n, "data-process"))
		}
		if n.Type == html.ElementNode && n.Data == "code" && text(n) == traces[0].ID {
			listed = true
		}
	}
	if want := []string{"counter/inc@gateway", "counter/inc@runner-1", "handle counter/inc@runner-1"}; !slices.Equal(names, want) {
		t.Errorf("-trace %s drew %v, want %v", traces[1].ID, names, want)
	}
	if !listed {
		t.Errorf("the relay's trace %s is not listed among the other traces", traces[0].ID)
	}
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// find returns the first element tag under n whose class has class ("":
// any).
func find(n *html.Node, tag, class string) *html.Node {
	for c := range n.Descendants() {
		if c.Type == html.ElementNode && c.Data == tag && (class == "" || slices.Contains(strings.Fields(attr(c, "class")), class)) {
			return c
		}
	}
	return nil
}

func text(n *html.Node) string {
	if n == nil {
		return ""
	}
	var b strings.Builder
	for c := range n.Descendants() {
		if c.Type == html.TextNode {
			b.WriteString(c.Data)
		}
	}
	return b.String()
}

// label returns the span name a row shows.
func label(row *html.Node) string { return text(find(row, "tspan", "label")) }

// mustAtoi returns s as a number, -2 when it is none (no depth is).
func mustAtoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -2
	}
	return n
}
