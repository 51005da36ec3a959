package main

import (
	"cmp"
	"slices"
	"time"
)

// Trace is the spans of one trace, from every file.
type Trace struct {
	ID        string
	Spans     []Span
	Start     time.Time // of its earliest span
	End       time.Time // of its latest
	Processes []string  // that recorded its spans, sorted
}

// Duration is the time from the trace's first start to its last end.
func (t Trace) Duration() time.Duration { return t.End.Sub(t.Start) }

// Root returns the trace's root span: the earliest of those whose parent
// is not among its spans.
func (t Trace) Root() Span {
	ids := make(map[string]bool, len(t.Spans))
	for _, s := range t.Spans {
		ids[s.SpanID] = true
	}
	var root Span
	for _, s := range t.Spans {
		if (s.ParentID == "" || !ids[s.ParentID]) && (root.SpanID == "" || s.Start.Before(root.Start)) {
			root = s
		}
	}
	if root.SpanID == "" && len(t.Spans) > 0 { // parents in a cycle
		root = t.Spans[0]
	}
	return root
}

// groupTraces groups spans by trace, in the order the waterfall prefers
// to draw them: the traces that cross the most processes first, then
// those with the most spans, then the slowest (ties by ID).
func groupTraces(spans []Span) []Trace {
	byID := map[string]*Trace{}
	var order []*Trace
	for _, s := range spans {
		t := byID[s.TraceID]
		if t == nil {
			t = &Trace{ID: s.TraceID, Start: s.Start, End: s.End}
			byID[s.TraceID] = t
			order = append(order, t)
		}
		t.Spans = append(t.Spans, s)
		if s.Start.Before(t.Start) {
			t.Start = s.Start
		}
		if s.End.After(t.End) {
			t.End = s.End
		}
		if !slices.Contains(t.Processes, s.Process) {
			t.Processes = append(t.Processes, s.Process)
		}
	}
	out := make([]Trace, 0, len(order))
	for _, t := range order {
		slices.Sort(t.Processes)
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b Trace) int {
		return cmp.Or(
			cmp.Compare(len(b.Processes), len(a.Processes)),
			cmp.Compare(len(b.Spans), len(a.Spans)),
			cmp.Compare(b.Duration(), a.Duration()),
			cmp.Compare(a.ID, b.ID))
	})
	return out
}

// Row is one span's line in the waterfall.
type Row struct {
	Span
	Depth  int           // 0 for a root, its parent's + 1 for the others
	Orphan bool          // its parent is not among the trace's spans (a file missing, or a span not exported yet)
	Offset time.Duration // from the trace's start to the span's
}

// layout orders a trace's spans for the waterfall: depth first from the
// roots, each span followed by its children, siblings (and roots) by start
// time. A span whose parent is missing is drawn as a root, marked orphan.
func layout(t Trace) []Row {
	ids := make(map[string]bool, len(t.Spans))
	for _, s := range t.Spans {
		ids[s.SpanID] = true
	}
	children := map[string][]Span{}
	var roots []Span
	for _, s := range t.Spans {
		if s.ParentID == "" || !ids[s.ParentID] {
			roots = append(roots, s)
		} else {
			children[s.ParentID] = append(children[s.ParentID], s)
		}
	}
	byStart := func(a, b Span) int {
		return cmp.Or(a.Start.Compare(b.Start), b.End.Compare(a.End), cmp.Compare(a.SpanID, b.SpanID))
	}
	rows := make([]Row, 0, len(t.Spans))
	seen := make(map[string]bool, len(t.Spans))
	var walk func(siblings []Span, depth int)
	walk = func(siblings []Span, depth int) {
		slices.SortFunc(siblings, byStart)
		for _, s := range siblings {
			if seen[s.SpanID] { // a duplicate span ID: drawn once
				continue
			}
			seen[s.SpanID] = true
			rows = append(rows, Row{
				Span:   s,
				Depth:  depth,
				Orphan: s.ParentID != "" && !ids[s.ParentID],
				Offset: s.Start.Sub(t.Start),
			})
			walk(children[s.SpanID], depth+1)
		}
	}
	walk(roots, 0)
	for _, s := range t.Spans { // spans whose parents form a cycle (a corrupt file): drawn as roots
		if !seen[s.SpanID] {
			walk([]Span{s}, 0)
		}
	}
	return rows
}
