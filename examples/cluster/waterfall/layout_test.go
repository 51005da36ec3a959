package main

import (
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)

// span makes a span of trace "t" (hex IDs from the short names given)
// from start to end microseconds after t0.
func span(trace, id, parent, proc string, start, end int) Span {
	hexID := func(s string, n int) string {
		if s == "" {
			return ""
		}
		return fmt.Sprintf("%0*x", n, s)
	}
	return Span{
		TraceID: hexID(trace, 32), SpanID: hexID(id, 16), ParentID: hexID(parent, 16), Name: id, Process: proc,
		Start: t0.Add(time.Duration(start) * time.Microsecond), End: t0.Add(time.Duration(end) * time.Microsecond),
	}
}

// TestLayoutPutsChildrenUnderParentsByStart checks the rows of a trace
// given in scrambled order: depth first, each span followed by its
// children, siblings by start time, depths from the roots, offsets from
// the trace's first start, and a span whose parent is missing drawn as a
// root marked orphan.
func TestLayoutPutsChildrenUnderParentsByStart(t *testing.T) {
	tr := groupTraces([]Span{
		span("t", "b2", "a", "r1", 60, 90),
		span("t", "c1", "b1", "r2", 20, 30),
		span("t", "a", "", "gw", 0, 100),
		span("t", "b1", "a", "r1", 10, 50),
		span("t", "c2", "b1", "r2", 35, 45),
		span("t", "d", "b2", "r2", 70, 80),
		span("t", "o", "gone", "r3", 95, 120), // its parent was not exported
	})[0]
	rows := layout(tr)
	type row struct {
		name   string
		depth  int
		orphan bool
		offset time.Duration
	}
	var got []row
	for _, r := range rows {
		got = append(got, row{r.Name, r.Depth, r.Orphan, r.Offset})
	}
	us := time.Microsecond
	want := []row{{"a", 0, false, 0}, {"b1", 1, false, 10 * us}, {"c1", 2, false, 20 * us}, {"c2", 2, false, 35 * us},
		{"b2", 1, false, 60 * us}, {"d", 2, false, 70 * us}, {"o", 0, true, 95 * us}}
	if !slices.Equal(got, want) {
		t.Errorf("layout =\n%v\nwant\n%v", got, want)
	}
	if tr.Duration() != 120*us || tr.Root().Name != "a" || !slices.Equal(tr.Processes, []string{"gw", "r1", "r2", "r3"}) {
		t.Errorf("trace: duration %v, root %q, processes %v; want 120µs, a, [gw r1 r2 r3]", tr.Duration(), tr.Root().Name, tr.Processes)
	}
}

// TestLayoutDrawsEverySpanOnce: spans whose parent links form a cycle (a
// corrupt file) and a duplicated span are still drawn, each once.
func TestLayoutDrawsEverySpanOnce(t *testing.T) {
	tr := groupTraces([]Span{
		span("t", "a", "", "gw", 0, 10),
		span("t", "x", "y", "r1", 1, 2),
		span("t", "y", "x", "r1", 3, 4),
		span("t", "a", "", "gw", 0, 10),
	})[0]
	var names []string
	for _, r := range layout(tr) {
		names = append(names, r.Name)
	}
	if slices.Sort(names); !slices.Equal(names, []string{"a", "x", "y"}) {
		t.Errorf("rows %v, want a, x and y once each", names)
	}
}

// TestGroupTracesOrdersByProcessesSpansDuration: the default trace is the
// one across the most processes, then with the most spans, then the
// slowest.
func TestGroupTracesOrdersByProcessesSpansDuration(t *testing.T) {
	spans := []Span{
		span("slow", "s1", "", "gw", 0, 5000), span("slow", "s2", "s1", "r1", 10, 20),
		span("wide", "w1", "", "gw", 0, 100), span("wide", "w2", "w1", "r1", 10, 20), span("wide", "w3", "w2", "r2", 12, 18),
		span("many", "m1", "", "gw", 0, 100), span("many", "m2", "m1", "r1", 10, 20), span("many", "m3", "m2", "r1", 12, 18),
		span("fast", "f1", "", "gw", 0, 50), span("fast", "f2", "f1", "r1", 10, 20),
	}
	var got []string
	for _, tr := range groupTraces(spans) {
		got = append(got, tr.Root().Name)
	}
	if want := []string{"w1", "m1", "s1", "f1"}; !slices.Equal(got, want) {
		t.Errorf("traces in drawing order: roots %v, want %v", got, want)
	}
}

// TestBarGeometry: bars are placed and sized in proportion to the trace's
// duration over plotWidth, a span too short to see minBar wide.
func TestBarGeometry(t *testing.T) {
	total := 1000 * time.Microsecond
	for _, tc := range []struct {
		offset, dur time.Duration
		x, w        float64
	}{
		{0, total, 0, plotWidth},
		{250 * time.Microsecond, 500 * time.Microsecond, plotWidth / 4, plotWidth / 2},
		{999 * time.Microsecond, time.Nanosecond, plotWidth * 0.999, minBar},
	} {
		r := Row{Span: Span{Start: t0.Add(tc.offset), End: t0.Add(tc.offset + tc.dur)}, Offset: tc.offset}
		if x, w := barGeometry(r, total); math.Abs(x-tc.x) > 1e-9 || math.Abs(w-tc.w) > 1e-9 {
			t.Errorf("barGeometry(offset %v, duration %v of %v) = %v, %v; want %v, %v", tc.offset, tc.dur, total, x, w, tc.x, tc.w)
		}
	}
}

// TestTicks: about five round ticks over the trace, from 0.
func TestTicks(t *testing.T) {
	for _, tc := range []struct {
		total time.Duration
		want  []time.Duration
	}{
		{2450 * time.Microsecond, []time.Duration{0, 500 * time.Microsecond, time.Millisecond, 1500 * time.Microsecond, 2 * time.Millisecond}},
		{100 * time.Millisecond, []time.Duration{0, 20 * time.Millisecond, 40 * time.Millisecond, 60 * time.Millisecond, 80 * time.Millisecond, 100 * time.Millisecond}},
		{7 * time.Second, []time.Duration{0, 2 * time.Second, 4 * time.Second, 6 * time.Second}},
	} {
		if got := ticks(tc.total); !slices.Equal(got, tc.want) {
			t.Errorf("ticks(%v) = %v, want %v", tc.total, got, tc.want)
		}
	}
}

// TestReadSpansRejectsBadLines: a line that is not an exported span is a
// FormatError naming the file and line.
func TestReadSpansRejectsBadLines(t *testing.T) {
	good := `{"Name":"a","SpanContext":{"TraceID":"0af7651916cd43dd8448eb211c80319c","SpanID":"b7ad6b7169203331"},"Parent":{"TraceID":"00000000000000000000000000000000","SpanID":"0000000000000000"},"SpanKind":3,"StartTime":"2026-11-27T12:00:00Z","EndTime":"2026-11-27T12:00:01Z","Status":{"Code":"Error","Description":"boom"},"Resource":[{"Key":"service.instance.id","Value":{"Type":"STRING","Value":"gateway"}}]}`
	spans, err := readSpans(strings.NewReader(good+"\n\n"), "gw")
	if err != nil || len(spans) != 1 || spans[0].Process != "gateway" || spans[0].Kind != "client" || !spans[0].Error || spans[0].ParentID != "" || spans[0].Duration() != time.Second {
		t.Fatalf("readSpans(a good line) = %+v, %v", spans, err)
	}
	for _, tc := range []struct{ name, line, want string }{
		{"not JSON", `{"Name":`, "unexpected end"},
		{"no trace ID", strings.Replace(good, "0af7651916cd43dd8448eb211c80319c", "", 1), "trace ID"},
		{"zero span ID", strings.Replace(good, "b7ad6b7169203331", "0000000000000000", 1), "span ID"},
		{"ends before it starts", strings.Replace(good, "12:00:01Z", "11:59:59Z", 1), "end not before"},
		{"unknown kind", strings.Replace(good, `"SpanKind":3`, `"SpanKind":9`, 1), "kind 9"},
	} {
		_, err := readSpans(strings.NewReader(good+"\n"+tc.line+"\n"), "spans-x")
		var fe *FormatError
		if !errors.As(err, &fe) || fe.File != "spans-x" || fe.Line != 2 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: readSpans = %v, want a FormatError at spans-x:2 about %q", tc.name, err, tc.want)
		}
	}
}

// TestRunRejectsUnknownTraceAndEmptyFiles: the command's errors are typed.
func TestRunRejectsUnknownTraceAndEmptyFiles(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.jsonl")
	writeFile(t, empty, "")
	if err := run([]string{"-o", filepath.Join(dir, "out.html"), empty}, &strings.Builder{}); !errors.Is(err, ErrNoSpans) {
		t.Errorf("run(an empty file) = %v, want %v", err, ErrNoSpans)
	}
	files := exportTrace(t, dir)
	err := run(append([]string{"-o", filepath.Join(dir, "out.html"), "-trace", strings.Repeat("ab", 16)}, files...), &strings.Builder{})
	if !errors.Is(err, ErrUnknownTrace) {
		t.Errorf("run(-trace of no span) = %v, want %v", err, ErrUnknownTrace)
	}
}
