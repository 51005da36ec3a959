package main

import (
	"fmt"
	"html/template"
	"math"
	"strings"
	"time"
)

// SVG charts for the HTML report.

// chart draws one SVG plot: time on x (seconds), a linear or log y.
type chart struct {
	id             int
	b              strings.Builder
	w, h           float64
	left, right    float64
	top, bottom    float64
	x0, x1, y0, y1 float64
	log            bool
}

func newChart(h, x1, y0, y1 float64, log bool) *chart {
	c := &chart{id: int(charts.Add(1)), w: 1100, h: h, left: 64, right: 16, top: 14, bottom: 34, x1: x1, y0: y0, y1: y1, log: log}
	if c.x1 <= c.x0 {
		c.x1 = c.x0 + 1
	}
	if c.y1 <= c.y0 {
		c.y1 = c.y0 + 1
	}
	fmt.Fprintf(&c.b, `<svg viewBox="0 0 %g %g" width="%g" height="%g" xmlns="http://www.w3.org/2000/svg" font-family="system-ui,DejaVu Sans,sans-serif" font-size="11">`, c.w, c.h, c.w, c.h)
	fmt.Fprintf(&c.b, `<defs><clipPath id="plot%d"><rect x="%g" y="%g" width="%g" height="%g"/></clipPath></defs>`,
		c.id, c.left, c.top, c.w-c.left-c.right, c.h-c.top-c.bottom)
	return c
}

// plot starts the clipped drawing area (after the axes); svg ends it.
func (c *chart) plot() { c.printf(`<g clip-path="url(#plot%d)">`, c.id) }

func (c *chart) x(t float64) float64 {
	return c.left + (t-c.x0)/(c.x1-c.x0)*(c.w-c.left-c.right)
}

func (c *chart) y(v float64) float64 {
	f := (v - c.y0) / (c.y1 - c.y0)
	if c.log {
		v = max(v, c.y0)
		f = math.Log10(v/c.y0) / math.Log10(c.y1/c.y0)
	}
	return c.h - c.bottom - f*(c.h-c.top-c.bottom)
}

func (c *chart) printf(format string, args ...any) { fmt.Fprintf(&c.b, format, args...) }

// axes draws the grid, the ticks and the axis labels.
func (c *chart) axes(ylabel string, yfmt func(float64) string) {
	xs := niceStep((c.x1 - c.x0) / 12)
	for t := math.Ceil(c.x0/xs) * xs; t <= c.x1+1e-9; t += xs {
		c.printf(`<line x1="%.1f" x2="%.1f" y1="%g" y2="%g" stroke="#eee"/>`, c.x(t), c.x(t), c.top, c.h-c.bottom)
		c.printf(`<text x="%.1f" y="%g" text-anchor="middle" fill="#666">%gs</text>`, c.x(t), c.h-c.bottom+14, t)
	}
	var ticks []float64
	if c.log {
		for p := math.Pow(10, math.Floor(math.Log10(c.y0))); p <= c.y1*1.0001; p *= 10 {
			if p >= c.y0*0.9999 {
				ticks = append(ticks, p)
			}
		}
	} else {
		ys := niceStep((c.y1 - c.y0) / 5)
		for v := math.Ceil(c.y0/ys) * ys; v <= c.y1+1e-9; v += ys {
			ticks = append(ticks, v)
		}
	}
	for _, v := range ticks {
		c.printf(`<line x1="%g" x2="%g" y1="%.1f" y2="%.1f" stroke="#eee"/>`, c.left, c.w-c.right, c.y(v), c.y(v))
		c.printf(`<text x="%g" y="%.1f" text-anchor="end" fill="#666">%s</text>`, c.left-6, c.y(v)+4, yfmt(v))
	}
	c.printf(`<rect x="%g" y="%g" width="%g" height="%g" fill="none" stroke="#bbb"/>`, c.left, c.top, c.w-c.left-c.right, c.h-c.top-c.bottom)
	c.printf(`<text x="%g" y="%g" fill="#444" transform="rotate(-90 %g %g)" text-anchor="middle">%s</text>`,
		12.0, (c.top+c.h-c.bottom)/2, 12.0, (c.top+c.h-c.bottom)/2, template.HTMLEscapeString(ylabel))
	c.printf(`<text x="%g" y="%g" text-anchor="end" fill="#444">time since the churn began</text>`, c.w-c.right, c.h-4)
}

// stepMarks shades each step from its start to settled (to the end if it
// never settled) and draws a labelled line at its start.
func (c *chart) stepMarks(tl *timeline, labels bool) {
	for i, s := range tl.steps {
		end := s.settled
		if end < 0 {
			end = tl.end
		}
		col := stepColor[s.kind]
		c.printf(`<rect x="%.1f" y="%g" width="%.1f" height="%g" fill="%s" fill-opacity="0.10"><title>step %d: %s %s, settled after %s</title></rect>`,
			c.x(s.start), c.top, max(c.x(end)-c.x(s.start), 1), c.h-c.top-c.bottom, col, i+1, s.kind, s.runner, settleText(s))
		c.printf(`<line x1="%.1f" x2="%.1f" y1="%g" y2="%g" stroke="%s" stroke-dasharray="3 2"/>`, c.x(s.start), c.x(s.start), c.top, c.h-c.bottom, col)
		if labels {
			c.printf(`<text x="%.1f" y="%g" fill="%s" font-weight="600">%s</text>`, c.x(s.start)+3, c.top+11+float64(i%2)*12, col, stepLabel(s))
		}
	}
}

func settleText(s tlStep) string {
	if s.settled < 0 {
		return "never"
	}
	return round(time.Duration((s.settled - s.start) * float64(time.Second))).String()
}

func stepLabel(s tlStep) string {
	switch s.kind {
	case stepAdd:
		return "+" + s.runner
	case stepShutdown:
		return "stop " + s.runner
	case stepBurstJoin:
		return "+" + s.runner
	case stepBurstLeave:
		return "stop " + s.runner
	default:
		return "crash " + s.runner
	}
}

// polyline draws a series; step draws it as a staircase.
func (c *chart) polyline(ps []point, color string, width float64, step bool, title string) {
	if len(ps) == 0 {
		return
	}
	var b strings.Builder
	for i, p := range ps {
		if step && i > 0 {
			fmt.Fprintf(&b, "%.1f,%.1f ", c.x(p.t), c.y(ps[i-1].v))
		}
		fmt.Fprintf(&b, "%.1f,%.1f ", c.x(p.t), c.y(p.v))
	}
	c.printf(`<polyline fill="none" stroke="%s" stroke-width="%g" points="%s"><title>%s</title></polyline>`, color, width, b.String(), template.HTMLEscapeString(title))
}

func (c *chart) svg() template.HTML {
	c.b.WriteString("</g></svg>")
	return template.HTML(c.b.String())
}

func fmtCount(v float64) string { return fmt.Sprintf("%g", v) }

func fmtMillis(v float64) string {
	return round(time.Duration(v * float64(time.Millisecond))).String()
}
