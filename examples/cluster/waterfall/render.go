package main

import (
	"fmt"
	"html/template"
	"io"
	"math"
	"path/filepath"
	"strings"
	"time"
)

// The waterfall's geometry, in SVG user units (CSS pixels).
const (
	labelWidth = 380 // the span names, indented by depth
	indent     = 14  // per depth
	plotWidth  = 760 // the time axis
	durWidth   = 90  // the duration after the last bar
	rowHeight  = 22
	barHeight  = 14
	axisHeight = 28
	minBar     = 1 // the narrowest bar drawn
)

// palette colours the processes (by their order in Trace.Processes).
var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac", "#e15759"}

// barGeometry returns a row's bar: its x from the plot's left edge and its
// width, scaled so that the trace's whole duration is plotWidth wide (a
// span too short to see is minBar wide).
func barGeometry(r Row, total time.Duration) (x, w float64) {
	if total <= 0 {
		return 0, plotWidth
	}
	x = float64(r.Offset) / float64(total) * plotWidth
	w = float64(r.Duration()) / float64(total) * plotWidth
	return x, max(w, minBar)
}

// ticks returns the axis's tick times: from 0 by a round step (1, 2 or 5
// times a power of ten), the smallest not under 3/4 of a fifth of total.
func ticks(total time.Duration) []time.Duration {
	if total <= 0 {
		return []time.Duration{0}
	}
	raw := float64(total) / 5
	pow := math.Pow(10, math.Floor(math.Log10(raw)))
	step := 10 * pow
	for _, m := range []float64{1, 2, 5} {
		if pow*m >= raw*0.75 {
			step = pow * m
			break
		}
	}
	var out []time.Duration
	for i := 0; float64(i)*step <= float64(total); i++ {
		out = append(out, time.Duration(math.Round(float64(i)*step)))
	}
	return out
}

// formatDuration prints d with 3 significant digits in µs, ms or s.
func formatDuration(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return trim(float64(d)/1e3) + "µs"
	case d < time.Second:
		return trim(float64(d)/1e6) + "ms"
	default:
		return trim(float64(d)/1e9) + "s"
	}
}

func trim(v float64) string {
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// svgRow is a row as the template draws it.
type svgRow struct {
	Row
	Y, TextY, BarY float64
	NameX          float64
	BarX, BarW     float64
	DurX           float64
	Colour         string
	Title          string
	Dur            string
	Marks          []svgEvent
}

// svgEvent is a span event's mark on its bar.
type svgEvent struct {
	X     float64
	Title string
}

type svgTick struct {
	X     float64
	Label string
}

type legend struct{ Process, Colour string }

type page struct {
	Trace        Trace
	Total        string
	Width        int
	Height       int
	PlotX        float64
	AxisY        float64
	Rows         []svgRow
	Ticks        []svgTick
	Legend       []legend
	Errors       int
	Others       []Trace // the next traces in the drawing order, to pick with -trace
	MoreTraces   int
	GeneratedFor string
}

// render writes the page of trace t: its rows (layout) as an inline SVG
// waterfall. others are other traces of the files, listed below it.
func render(w io.Writer, t Trace, others []Trace, files []string) error {
	rows := layout(t)
	total := t.Duration()
	colour := map[string]string{}
	p := page{
		Trace:        t,
		Total:        formatDuration(total),
		Width:        labelWidth + plotWidth + durWidth,
		Height:       axisHeight + len(rows)*rowHeight + 8,
		PlotX:        labelWidth,
		AxisY:        axisHeight - 6,
		GeneratedFor: strings.Join(bases(files), " "),
	}
	for i, proc := range t.Processes {
		colour[proc] = palette[i%len(palette)]
		p.Legend = append(p.Legend, legend{proc, colour[proc]})
	}
	for _, tk := range ticks(total) {
		x := labelWidth + float64(tk)/float64(max(total, 1))*plotWidth
		p.Ticks = append(p.Ticks, svgTick{X: x, Label: formatDuration(tk)})
	}
	for i, r := range rows {
		x, bw := barGeometry(r, total)
		y := float64(axisHeight + i*rowHeight)
		if r.Error {
			p.Errors++
		}
		var marks []svgEvent
		for _, e := range r.Events {
			ex := labelWidth + float64(e.Time.Sub(t.Start))/float64(max(total, 1))*plotWidth
			marks = append(marks, svgEvent{X: min(max(ex, labelWidth), labelWidth+plotWidth), Title: eventText(e, r.Start)})
		}
		p.Rows = append(p.Rows, svgRow{
			Marks:  marks,
			Row:    r,
			Y:      y,
			TextY:  y + rowHeight/2 + 4,
			BarY:   y + (rowHeight-barHeight)/2,
			NameX:  float64(8 + r.Depth*indent),
			BarX:   labelWidth + x,
			BarW:   bw,
			DurX:   labelWidth + x + bw + 4,
			Colour: colour[r.Process],
			Title:  title(r),
			Dur:    formatDuration(r.Duration()),
		})
	}
	if len(others) > 10 {
		p.Others, p.MoreTraces = others[:10], len(others)-10
	} else {
		p.Others = others
	}
	return pageTemplate.Execute(w, p)
}

func bases(files []string) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i] = filepath.Base(f)
	}
	return out
}

// title is a row's tooltip: what the span is, its attributes and events.
func title(r Row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n%s span on %s, %s (at +%s)\nspan %s", r.Name, cmpOr(r.Kind, "unspecified"), r.Process, formatDuration(r.Duration()), formatDuration(r.Offset), r.SpanID)
	if r.ParentID != "" {
		fmt.Fprintf(&b, ", parent %s", r.ParentID)
		if r.Orphan {
			b.WriteString(" (not in the files)")
		}
	}
	if r.Error {
		fmt.Fprintf(&b, "\nERROR %s", r.Status)
	}
	for _, a := range r.Attrs {
		fmt.Fprintf(&b, "\n%s = %s", a.Key, a.Value)
	}
	for _, e := range r.Events {
		b.WriteString("\n" + eventText(e, r.Start))
	}
	return b.String()
}

// eventText describes event e of a span that started at start.
func eventText(e Event, start time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "event %s at +%s", e.Name, formatDuration(e.Time.Sub(start)))
	for _, a := range e.Attrs {
		fmt.Fprintf(&b, " %s=%s", a.Key, a.Value)
	}
	return b.String()
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"f":         func(v float64) string { return fmt.Sprintf("%.2f", v) },
	"ns":        func(d time.Duration) int64 { return d.Nanoseconds() },
	"dur":       formatDuration,
	"plotWidth": func() int { return plotWidth },
	"rowHeight": func() int { return rowHeight },
	"barHeight": func() int { return barHeight },
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>trace {{.Trace.ID}}</title>
<style>
body { font: 13px system-ui, sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 16px; margin: 0 0 4px; }
.meta { color: #555; margin-bottom: 8px; }
.meta code { font-size: 12px; }
.legend span { display: inline-block; margin-right: 14px; }
.legend i { display: inline-block; width: 12px; height: 12px; margin-right: 4px; vertical-align: -2px; border-radius: 2px; }
svg { display: block; margin: 8px 0 12px; }
svg text { font: 12px system-ui, sans-serif; fill: #222; }
svg .axis text { fill: #777; font-size: 11px; }
svg .axis line { stroke: #e4e4e4; }
svg .stripe { fill: transparent; }
svg .row:nth-child(even) .stripe { fill: #f7f7f9; }
svg .row:hover .stripe { fill: #e8eefc; }
svg .bar.error { stroke: #d00; stroke-width: 2; }
svg .mark { fill: #d00; font-weight: bold; }
svg .dur { fill: #666; font-size: 11px; }
svg .kind { fill: #999; font-size: 11px; }
svg .event { fill: #fff; stroke: #222; stroke-width: 1; }
svg .orphan { font-style: italic; }
table { border-collapse: collapse; font-size: 12px; }
td, th { padding: 2px 10px 2px 0; text-align: left; }
</style>
</head>
<body data-spans="{{len .Rows}}">
<h1>{{.Trace.Root.Name}} — {{.Total}}, {{len .Rows}} spans across {{len .Trace.Processes}} processes{{if .Errors}}, {{.Errors}} with an error{{end}}</h1>
<div class="meta">trace <code>{{.Trace.ID}}</code>, started {{.Trace.Start.UTC.Format "2006-01-02 15:04:05.000000"}} UTC. Hover a row for its attributes and events.</div>
<div class="legend">{{range .Legend}}<span><i style="background: {{.Colour}}"></i>{{.Process}}</span>{{end}}<span><i style="border: 2px solid #d00; width: 8px; height: 8px"></i>error</span><span>◇ event (retry, exception)</span></div>
<svg id="waterfall" xmlns="http://www.w3.org/2000/svg" width="{{.Width}}" height="{{.Height}}" viewBox="0 0 {{.Width}} {{.Height}}" data-plot-x="{{f .PlotX}}" data-plot-width="{{plotWidth}}" data-total-ns="{{ns .Trace.Duration}}">
<g class="axis">{{range .Ticks}}<line x1="{{f .X}}" x2="{{f .X}}" y1="{{f $.AxisY}}" y2="{{$.Height}}"></line><text x="{{f .X}}" y="14" text-anchor="middle">{{.Label}}</text>{{end}}</g>
<g class="rows">{{range .Rows}}
<g class="row" data-span-id="{{.SpanID}}" data-parent-id="{{.ParentID}}" data-depth="{{.Depth}}" data-process="{{.Process}}" data-kind="{{.Kind}}" data-offset-ns="{{ns .Offset}}" data-duration-ns="{{ns .Duration}}"{{if .Error}} data-error="true"{{end}}>
<title>{{.Title}}</title>
<rect class="stripe" x="0" y="{{f .Y}}" width="{{$.Width}}" height="{{rowHeight}}"></rect>
<text class="name{{if .Orphan}} orphan{{end}}" x="{{f .NameX}}" y="{{f .TextY}}">{{if .Error}}<tspan class="mark">✕ </tspan>{{end}}<tspan class="label">{{.Name}}</tspan>{{if .Kind}}<tspan class="kind"> {{.Kind}}</tspan>{{end}}</text>
<rect class="bar{{if .Error}} error{{end}}" x="{{f .BarX}}" y="{{f .BarY}}" width="{{f .BarW}}" height="{{barHeight}}" rx="2" fill="{{.Colour}}"></rect>
{{$y := .TextY}}{{range .Marks}}<path class="event" d="M{{f .X}} {{f $y}}m0 -8l4 4l-4 4l-4 -4z"><title>{{.Title}}</title></path>{{end}}
<text class="dur" x="{{f .DurX}}" y="{{f .TextY}}">{{.Dur}}</text>
</g>{{end}}
</g>
</svg>
{{if .Others}}<div class="meta">Other traces in the files (draw one with <code>-trace ID</code>):</div>
<table><tr><th>trace</th><th>root</th><th>spans</th><th>processes</th><th>duration</th></tr>
{{range .Others}}<tr><td><code>{{.ID}}</code></td><td>{{.Root.Name}}</td><td>{{len .Spans}}</td><td>{{len .Processes}}</td><td>{{dur .Duration}}</td></tr>
{{end}}</table>{{if .MoreTraces}}<div class="meta">… and {{.MoreTraces}} more.</div>{{end}}{{end}}
<div class="meta">Drawn by examples/cluster/waterfall from {{.GeneratedFor}}.</div>
<script>
// Record where each bar was drawn on its row (data-drawn-x from the
// picture's left edge, data-drawn-width; CSS pixels): a headless browser
// check compares what was drawn with the spans' times.
const left = document.getElementById("waterfall").getBoundingClientRect().left;
for (const g of document.querySelectorAll("#waterfall .row")) {
  const r = g.querySelector("rect.bar").getBoundingClientRect();
  g.dataset.drawnX = (r.left - left).toFixed(2);
  g.dataset.drawnWidth = r.width.toFixed(2);
}
document.body.dataset.drawn = document.querySelectorAll("#waterfall .row[data-drawn-width]").length;
</script>
</body>
</html>
`))
