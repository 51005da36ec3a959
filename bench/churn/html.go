package main

import (
	"cmp"
	"fmt"
	"html/template"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/runner"
)

// timeline is what the HTML report draws: the run's recorded events,
// steps and asks as series over time, in seconds since the churn began.
type timeline struct {
	end     float64          // the load's end
	runners []string         // hosting runners, r1 first
	times   []float64        // when ownership changed (from 0)
	owned   []map[string]int // shards owned per runner from times[i] on
	steps   []tlStep
	moves   []tlMove
	width   float64 // of an ask bucket, in seconds
	buckets []askBucket
}

type point struct{ t, v float64 }

type tlStep struct {
	kind, runner   string
	start, settled float64 // settled < 0: did not settle
}

type tlMove struct {
	shard      int
	from, to   string
	start, end float64
	crash      bool
}

// askBucket sums up the asks that started in [t, t+width).
type askBucket struct {
	t             float64
	ok            int
	p50, p99, max float64        // of successful asks, in ms
	failed        map[string]int // by class
}

// timeline builds the series from what the run recorded.
func (h *harness) timeline(churnStart, end, loadBegan time.Time, asks []askRec) *timeline {
	rel := func(t time.Time) float64 { return t.Sub(churnStart).Seconds() }
	tl := &timeline{end: rel(end)}

	// Shards owned per runner: +1 on acquire, -1 on release or loss; a
	// column per change (changes closer than 10 ms share one). Changes
	// before the churn make the starting column; those after the load
	// (the final shutdown) are left out.
	count := map[string]int{}
	evs := h.rec.all()
	for _, ev := range evs {
		b := ev.Base()
		delta := 0
		switch ev.(type) {
		case runner.ShardAcquired:
			delta = 1
		case runner.ShardReleased, runner.ShardLost:
			delta = -1
		default:
			continue
		}
		t := max(rel(b.Time), 0)
		if t > tl.end {
			break
		}
		if _, seen := count[b.Runner]; !seen {
			tl.runners = append(tl.runners, b.Runner)
		}
		count[b.Runner] += delta
		if n := len(tl.times); n > 0 && t-tl.times[n-1] < 0.01 {
			tl.owned[n-1] = maps.Clone(count)
		} else {
			tl.times = append(tl.times, t)
			tl.owned = append(tl.owned, maps.Clone(count))
		}
	}
	slices.SortFunc(tl.runners, func(a, b string) int {
		// r2 before r10: runner IDs are r<number>.
		return cmp.Or(cmp.Compare(len(a), len(b)), strings.Compare(a, b))
	})

	for _, s := range h.steps {
		st := tlStep{kind: s.Kind, runner: s.Runner, start: rel(s.start), settled: -1}
		if !s.settled.IsZero() {
			st.settled = rel(s.settled)
		}
		tl.steps = append(tl.steps, st)
	}
	inRun := func(t time.Time) bool { return !t.Before(churnStart) && !t.After(end) }
	wins, _ := cutovers(evs, h.crashes, inRun)
	for _, w := range wins {
		tl.moves = append(tl.moves, tlMove{shard: int(w.shard), from: w.from, to: w.to, start: rel(w.start), end: rel(w.end), crash: w.crash})
	}

	// Asks in buckets of about 1/150 of the run (at least 100 ms).
	tl.width = niceStep(max(tl.end/150, 0.1))
	offset := loadBegan.Sub(churnStart)
	n := int(math.Ceil(tl.end / tl.width)) // the last bucket may end after the load
	lat := make([][]time.Duration, n)
	tl.buckets = make([]askBucket, n)
	for i := range tl.buckets {
		tl.buckets[i] = askBucket{t: float64(i) * tl.width, failed: map[string]int{}}
	}
	for _, a := range asks {
		i := int(math.Floor((a.at + offset).Seconds() / tl.width))
		if i < 0 || i >= n {
			continue
		}
		if a.class != 0 {
			tl.buckets[i].failed[classes[a.class-1]]++
			continue
		}
		tl.buckets[i].ok++
		lat[i] = append(lat[i], a.dur)
	}
	for i := range tl.buckets {
		if d := distOf(lat[i]); d.N > 0 {
			tl.buckets[i].p50, tl.buckets[i].p99, tl.buckets[i].max = d.P50, d.P99, d.Max
		}
	}
	return tl
}

// niceStep rounds v up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p*1.0000001 {
			return m * p
		}
	}
	return 10 * p
}

// Colours: runners (as on the debug page), step kinds, failure classes.
var (
	runnerPalette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#9c755f", "#a0cbe8", "#8cd17d", "#d37295", "#ffbe7d", "#79706e"}
	stepColor     = map[string]string{stepAdd: "#2e7d32", stepShutdown: "#1565c0", stepCrash: "#c62828", stepBurstJoin: "#66bb6a", stepBurstLeave: "#42a5f5"}
	classColor    = map[string]string{
		classMaybeDelivered: "#c62828", classNotOwner: "#ef6c00", classUndelivered: "#f9a825", classDeadline: "#6a1b9a", classOther: "#616161",
	}
)

func (tl *timeline) runnerColor(id string) string {
	i := slices.Index(tl.runners, id)
	if i < 0 {
		return "#999"
	}
	if i < len(runnerPalette) {
		return runnerPalette[i]
	}
	return fmt.Sprintf("hsl(%d 55%% 45%%)", i*137%360)
}

// charts numbers the charts of a page (their clip paths need distinct IDs).
var charts atomic.Int64

// ownedChart: shards owned per runner over time, stacked (runner r1 at
// the bottom), so the top edge is the number of owned shards and a dip
// below the dashed total is shards without an owner; steps marked.
func (tl *timeline) ownedChart(shards int) template.HTML {
	c := newChart(280, tl.end, 0, float64(shards)*1.12, false)
	c.axes("shards owned (stacked)", fmtCount)
	c.plot()
	if len(tl.times) > 0 {
		below := make([]float64, len(tl.times)) // stacked height under the current runner
		for _, id := range tl.runners {
			var upper strings.Builder
			var lower []string // the lower edge, drawn backwards
			for i, t := range tl.times {
				next := tl.end
				if i+1 < len(tl.times) {
					next = tl.times[i+1]
				}
				lo, hi := below[i], below[i]+float64(tl.owned[i][id])
				fmt.Fprintf(&upper, "%.1f,%.1f %.1f,%.1f ", c.x(t), c.y(hi), c.x(next), c.y(hi))
				lower = append(lower, fmt.Sprintf("%.1f,%.1f", c.x(t), c.y(lo)), fmt.Sprintf("%.1f,%.1f", c.x(next), c.y(lo)))
				below[i] = hi
			}
			slices.Reverse(lower)
			c.printf(`<polygon fill="%s" fill-opacity="0.85" stroke="%s" stroke-width="0.5" points="%s%s"><title>%s</title></polygon>`,
				tl.runnerColor(id), tl.runnerColor(id), upper.String(), strings.Join(lower, " "), id)
		}
	}
	c.printf(`<line x1="%g" x2="%g" y1="%.1f" y2="%.1f" stroke="#333" stroke-dasharray="5 3"><title>%d shards</title></line>`,
		c.left, c.w-c.right, c.y(float64(shards)), c.y(float64(shards)), shards)
	c.stepMarks(tl, true)
	return c.svg()
}

// movesChart: every moved shard's cutover (planned) or takeover (crash)
// window as a bar from the shard's release (or the crash) to its
// acquisition, one row per move in order of start.
func (tl *timeline) movesChart() template.HTML {
	moves := slices.Clone(tl.moves)
	slices.SortStableFunc(moves, func(a, b tlMove) int { return cmp.Compare(a.start, b.start) })
	c := newChart(min(max(160, 48+float64(len(moves))*0.6), 420), tl.end, 0, float64(max(len(moves), 1)), false)
	c.axes("moved shards", fmtCount)
	c.plot()
	c.stepMarks(tl, false)
	rowH := max((c.h-c.top-c.bottom)/float64(max(len(moves), 1)), 0.6)
	for i, m := range moves {
		col := "#1565c0"
		kind := "planned cutover"
		if m.crash {
			col, kind = "#c62828", "crash takeover"
		}
		y := c.y(float64(i + 1))
		c.printf(`<rect x="%.1f" y="%.2f" width="%.1f" height="%.2f" fill="%s"><title>shard %d %s -> %s: %s of %s</title></rect>`,
			c.x(m.start), y, max(c.x(m.end)-c.x(m.start), 1.5), max(rowH*0.8, 0.5), col, m.shard, m.from, m.to, kind,
			round(time.Duration((m.end-m.start)*float64(time.Second))))
	}
	return c.svg()
}

// latencyChart: p50, p99 and max of successful asks per bucket, log scale.
func (tl *timeline) latencyChart() template.HTML {
	lo, hi := math.Inf(1), 0.0
	for _, b := range tl.buckets {
		if b.ok > 0 {
			lo, hi = min(lo, b.p50), max(hi, b.max)
		}
	}
	if hi == 0 {
		lo, hi = 0.1, 1
	}
	lo = math.Pow(10, math.Floor(math.Log10(max(lo, 0.001))))
	hi = math.Pow(10, math.Ceil(math.Log10(hi)))
	c := newChart(260, tl.end, lo, hi, true)
	c.axes("ask latency", fmtMillis)
	c.plot()
	c.stepMarks(tl, true)
	// One line per quantity, broken where a bucket had no successful ask.
	line := func(f func(askBucket) float64, color string, width float64, title string) {
		var d strings.Builder
		move := true
		for _, b := range tl.buckets {
			if b.ok == 0 {
				move = true
				continue
			}
			op := "L"
			if move {
				op, move = "M", false
			}
			fmt.Fprintf(&d, "%s%.1f,%.1f ", op, c.x(b.t+tl.width/2), c.y(f(b)))
		}
		c.printf(`<path fill="none" stroke="%s" stroke-width="%g" d="%s"><title>%s</title></path>`, color, width, d.String(), title)
	}
	line(func(b askBucket) float64 { return b.max }, "#bbb", 1, "max")
	line(func(b askBucket) float64 { return b.p99 }, "#ef6c00", 2, "p99")
	line(func(b askBucket) float64 { return b.p50 }, "#1565c0", 2, "p50")
	return c.svg()
}

// asksChart: successful asks per second (line) and failed asks per
// bucket by class (stacked bars, right scale).
func (tl *timeline) asksChart() (template.HTML, int) {
	topOK, topFail, failed := 0.0, 0, 0
	for _, b := range tl.buckets {
		topOK = max(topOK, float64(b.ok)/tl.width)
		n := 0
		for _, v := range b.failed {
			n += v
		}
		topFail, failed = max(topFail, n), failed+n
	}
	c := newChart(260, tl.end, 0, max(topOK*1.1, 1), false)
	c.axes("successful asks / s", fmtRateAxis)
	c.plot()
	c.stepMarks(tl, true)
	if topFail > 0 {
		scale := (c.h - c.top - c.bottom) * 0.45 / float64(topFail) // failures use the lower 45 %
		bw := max(c.x(tl.width)-c.x(0)-1, 1)
		for _, b := range tl.buckets {
			y := c.h - c.bottom
			for _, cl := range classes {
				n := b.failed[cl]
				if n == 0 {
					continue
				}
				hgt := float64(n) * scale
				y -= hgt
				c.printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%d failed (%s) in [%gs, %gs)</title></rect>`,
					c.x(b.t), y, bw, hgt, classColor[cl], n, cl, b.t, b.t+tl.width)
			}
		}
		c.printf(`<text x="%g" y="%g" text-anchor="end" fill="#c62828">bars: failed asks per %gs (tallest %d)</text>`, c.w-c.right-4, c.top+12, tl.width, topFail)
	}
	var ps []point
	for _, b := range tl.buckets {
		ps = append(ps, point{b.t + tl.width/2, float64(b.ok) / tl.width})
	}
	c.polyline(ps, "#2e7d32", 2, false, "successful asks / s")
	return c.svg(), failed
}

func fmtRateAxis(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%gk", v/1000)
	}
	return fmt.Sprintf("%g", v)
}

// htmlPage is the report template's data.
type htmlPage struct {
	Rep                         *Report
	Text                        string
	Owned, Moves, Latency, Asks template.HTML
	Failed                      int
	Runners                     []legend
	Steps, Classes              []legend
	Planned, Crash, Width       string
	StepRows                    []htmlStep
	LoadCol                     string // what the callers' and gateway's CPU column holds
}

type legend struct{ Name, Color string }

// htmlStep is a row of the steps' cost table.
type htmlStep struct {
	N                                          int
	Kind, Runner, At, Settle                   string
	Moved                                      int
	Events, EventsPerMoved, Reqs, ReqsPerMoved string
	Change, Runners, Etcd, Load, Harness       string
}

// htmlSteps formats each step's cost for the table.
func htmlSteps(rep *Report) []htmlStep {
	var out []htmlStep
	f := func(format string, v float64) string { return fmt.Sprintf(format, v) }
	for i, s := range rep.Steps {
		c, settle := s.Cost, "did not settle"
		if s.Settled {
			settle = ms(s.Settle, 1)
		}
		out = append(out, htmlStep{
			N: i + 1, Kind: s.Kind, Runner: s.Runner, At: f("%.1fs", s.At), Settle: settle, Moved: c.Moved,
			Events: f("%.0f", c.WatchEvents), EventsPerMoved: f("%.1f", c.WatchEventsPerMoved),
			Reqs: f("%.0f", c.Requests), ReqsPerMoved: f("%.2f", c.RequestsPerMoved),
			Change: f("%.2f", c.ChangeCPU), Runners: f("%.2f", c.RunnersCPU), Etcd: f("%.2f", c.EtcdCPU),
			Load: f("%.2f", c.LoadCPU), Harness: f("%.3f", c.HarnessCPU),
		})
	}
	return out
}

// writeHTML writes the report as one self-contained HTML page with SVG
// charts: shards owned per runner over time (steps marked), the cutover
// and takeover window of every moved shard, ask latency p50/p99/max over
// time, successful and failed asks over time; then the printed report.
func (rep *Report) writeHTML(w io.Writer) error {
	tl := rep.timeline
	if tl == nil {
		return fmt.Errorf("no timeline recorded")
	}
	var text strings.Builder
	rep.print(&text)
	p := htmlPage{Rep: rep, Text: text.String(), Width: fmt.Sprintf("%gs", tl.width)}
	p.Owned = tl.ownedChart(rep.Params.Shards)
	p.Moves = tl.movesChart()
	p.Latency = tl.latencyChart()
	p.Asks, p.Failed = tl.asksChart()
	for _, id := range tl.runners {
		p.Runners = append(p.Runners, legend{id, tl.runnerColor(id)})
	}
	for _, k := range append(stepKinds, burstKinds...) {
		p.Steps = append(p.Steps, legend{k, stepColor[k]})
	}
	for _, cl := range classes {
		p.Classes = append(p.Classes, legend{cl, classColor[cl]})
	}
	p.StepRows, p.LoadCol = htmlSteps(rep), "the callers' and gateway's (a process of their own)"
	if rep.Params.InProcessLoad {
		p.LoadCol = "the callers' and gateway's counted with the runners' (-loadproc=false)"
	}
	d := rep.Cutover["planned"]
	p.Planned = fmt.Sprintf("%d shards, p50 %s, p99 %s, max %s", d.N, ms(d.P50, d.N), ms(d.P99, d.N), ms(d.Max, d.N))
	d = rep.Cutover["crash"]
	p.Crash = fmt.Sprintf("%d shards, p50 %s, p99 %s, max %s", d.N, ms(d.P50, d.N), ms(d.P99, d.N), ms(d.Max, d.N))
	return reportTpl.Execute(w, p)
}

var reportTpl = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>shardhost churn report</title>
<style>
body{margin:0;font:13px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#1d2330;background:#f6f7f9}
header{padding:12px 20px;background:#1d2330;color:#fff}
header h1{margin:0;font-size:17px}
header p{margin:4px 0 0;color:#b8c0d0}
main{padding:12px 20px 30px;display:grid;gap:14px;max-width:1160px}
section{background:#fff;border:1px solid #e3e6ec;border-radius:6px;padding:10px 14px}
h2{font-size:13px;text-transform:uppercase;letter-spacing:.04em;color:#6b7385;margin:0 0 6px}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;color:#555;margin:0 0 6px}
.legend i{display:inline-block;width:12px;height:12px;border-radius:2px;vertical-align:-2px;margin-right:5px}
.ok{color:#2e7d32;font-weight:600}.bad{color:#c62828;font-weight:600}
pre{margin:0;overflow:auto;font-size:12px}
.note{margin:0 0 6px;color:#555}
table{border-collapse:collapse;font-size:12px}
th,td{padding:2px 8px;border-bottom:1px solid #e3e6ec;text-align:right}
th{color:#6b7385;font-weight:600}
svg{max-width:100%;height:auto}
</style>
</head>
<body>
<header>
<h1>shardhost churn report</h1>
<p>{{.Rep.Params.Runners}} runners at start, {{.Rep.Params.Shards}} shards, lease TTL {{.Rep.Params.TTL}}s, {{.Rep.Params.Callers}} callers on {{.Rep.Params.Entities}} counters, {{printf "%.1f" .Rep.Measured}}s measured, {{len .Rep.Steps}} steps (seed {{.Rep.Params.Seed}}) ·
{{if .Rep.Problems}}<span class="bad">{{len .Rep.Problems}} problem(s)</span>{{else}}<span class="ok">OK</span>{{end}}</p>
</header>
<main>
<section id="owned">
<h2>Shards owned per runner</h2>
<div class="legend">{{range .Runners}}<span><i style="background:{{.Color}}"></i>{{.Name}}</span>{{end}} · steps: {{range .Steps}}<span><i style="background:{{.Color}};opacity:.5"></i>{{.Name}}</span>{{end}} <span>(shaded: step start to settled)</span></div>
{{.Owned}}
</section>
<section id="moves">
<h2>Cutover and takeover windows per moved shard</h2>
<div class="legend"><span><i style="background:#1565c0"></i>planned cutover (released → acquired): {{.Planned}}</span><span><i style="background:#c62828"></i>crash takeover (crash → acquired): {{.Crash}}</span></div>
{{.Moves}}
</section>
<section id="latency">
<h2>Ask latency (successful asks, per {{.Width}}, log scale)</h2>
<div class="legend"><span><i style="background:#1565c0"></i>p50</span><span><i style="background:#ef6c00"></i>p99</span><span><i style="background:#bbb"></i>max</span></div>
{{.Latency}}
</section>
<section id="asks">
<h2>Asks per second and failed asks ({{.Failed}} failed)</h2>
<div class="legend"><span><i style="background:#2e7d32"></i>successful asks / s</span>{{range .Classes}}<span><i style="background:{{.Color}}"></i>{{.Name}}</span>{{end}}</div>
{{.Asks}}
</section>
<section id="steps">
<h2>What each step cost (start to settle)</h2>
<p class="note">moved: cutovers completed in the step · watch deliveries: events etcd sent, one per event per watch · CPU in seconds, the change's own = runners + etcd; {{.LoadCol}} apart</p>
<div style="overflow:auto">
<table>
<thead><tr><th>#</th><th>step</th><th>runner</th><th>at</th><th>settle</th><th>moved</th><th>watch deliveries</th><th>/moved</th><th>etcd requests</th><th>/moved</th><th>change CPU</th><th>runners</th><th>etcd</th><th>callers + gateway</th><th>harness</th></tr></thead>
<tbody>{{range .StepRows}}<tr><td>{{.N}}</td><td>{{.Kind}}</td><td>{{.Runner}}</td><td>{{.At}}</td><td>{{.Settle}}</td><td>{{.Moved}}</td><td>{{.Events}}</td><td>{{.EventsPerMoved}}</td><td>{{.Reqs}}</td><td>{{.ReqsPerMoved}}</td><td>{{.Change}}</td><td>{{.Runners}}</td><td>{{.Etcd}}</td><td>{{.Load}}</td><td>{{.Harness}}</td></tr>
{{end}}</tbody>
</table>
</div>
</section>
<section id="text">
<h2>The printed report</h2>
<pre>{{.Text}}</pre>
</section>
</main>
</body>
</html>
`))
