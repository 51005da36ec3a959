package debugpage

import (
	"cmp"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"strconv"
	"strings"
	"time"
)

// The debug page's template, style sheet and script, embedded: the page
// needs no external asset and no build step.
//
//go:embed ui/page.html ui/style.css ui/app.js
var ui embed.FS

var (
	pageCSS = mustRead("ui/style.css")
	pageJS  = mustRead("ui/app.js")
	pageTpl = template.Must(template.New("debug").Funcs(template.FuncMap{
		"dur":       fmtMS,
		"age":       fmtAge,
		"rate":      fmtRate,
		"lag":       fmtLag,
		"phasePill": phasePill,
		"trim":      trim,
		"headline":  headline,
		"css":       func(s string) template.CSS { return template.CSS(s) }, // runnerColor's output only
	}).ParseFS(ui, "ui/page.html"))
)

func mustRead(name string) string {
	b, err := ui.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// page is the template's data.
type page struct {
	*State
	RefreshMS float64
	CSS       template.CSS
	JS        template.JS
	Palette   template.CSS  // a class per runner: its colour
	Cells     template.HTML // the shard grid's cells
	CellPx    int
	Meta      template.JS // JSON for the script: runner names, moves, handoffs
}

// render writes the page (or only its body, for the page's refresh).
func render(w io.Writer, st *State, cfg Config, bodyOnly bool) error {
	p := page{State: st, CSS: template.CSS(pageCSS), JS: template.JS(pageJS), CellPx: cellSize(st.Shards.Count)}
	if cfg.Refresh > 0 {
		p.RefreshMS = ms(cfg.Refresh)
	}
	p.Palette, p.Cells, p.Meta = shardGrid(st)
	name := "page"
	if bodyOnly {
		name = "body"
	}
	return pageTpl.ExecuteTemplate(w, name, p)
}

// cellSize is the side of a shard cell in pixels (plus a 1 px gap):
// smaller cells for more shards, so that the map fits a screen: 16 384
// shards are 128 x 128 cells of 5 px, 65 536 (sharding.MaxShards) 256 x
// 256 cells of 3 px.
func cellSize(n int) int {
	switch {
	case n <= 256:
		return 18
	case n <= 1024:
		return 12
	case n <= 4096:
		return 8
	case n <= 16384:
		return 5
	default:
		return 3
	}
}

// shardGrid renders the shard map compactly: one empty <i> per shard whose
// classes say its owner (c<index>, u unowned, x unknown lease), an
// in-flight handoff (h, plus r when ready), a lock not where the
// assignment wants it (m), and an owner that is unreachable or detached
// (d: its lock holds until its lease expires, but nobody serves the shard). About 20 bytes per shard before compression.
func shardGrid(st *State) (template.CSS, template.HTML, template.JS) {
	var css strings.Builder
	for i, r := range st.Runners {
		fmt.Fprintf(&css, "#grid i.c%d{background-color:%s}#grid[data-focus=\"%d\"] i.c%d{opacity:1}", i, r.Color, i, i)
	}
	handoff := make(map[int]Handoff, len(st.Handoffs))
	meta := struct {
		Runners  []string       `json:"runners"`
		Moves    map[int]string `json:"moves"`
		Handoffs map[int]string `json:"handoffs"`
	}{Runners: make([]string, len(st.Runners)), Moves: map[int]string{}, Handoffs: map[int]string{}}
	for i, r := range st.Runners {
		meta.Runners[i] = r.ID
	}
	for _, h := range st.Handoffs {
		handoff[int(h.Shard)] = h
		meta.Handoffs[int(h.Shard)] = fmt.Sprintf("%s %s -> %s", cmp.Or(h.Phase, "in flight"), h.From, h.To)
	}
	moving := make(map[int]bool, len(st.Shards.Moves))
	for _, m := range st.Shards.Moves {
		moving[int(m.Shard)] = true
		meta.Moves[int(m.Shard)] = m.To
	}
	down := make([]bool, len(st.Runners)) // owner unreachable or detached
	for i, r := range st.Runners {
		down[i] = r.StateError != "" || (r.State != nil && r.State.Detached != nil)
	}
	var b strings.Builder
	b.Grow(len(st.Shards.Owner) * 20)
	for s, o := range st.Shards.Owner {
		b.WriteString(`<i class="`)
		switch o {
		case Unowned:
			b.WriteByte('u')
		case UnknownOwner:
			b.WriteByte('x')
		default:
			b.WriteByte('c')
			b.WriteString(strconv.Itoa(o))
			if down[o] {
				b.WriteString(" d")
			}
		}
		if h, ok := handoff[s]; ok {
			b.WriteString(" h")
			if h.Phase == "ready" {
				b.WriteString(" r")
			}
		} else if moving[s] {
			b.WriteString(" m")
		}
		b.WriteString(`"></i>`)
	}
	js, _ := json.Marshal(meta) // maps and strings only: cannot fail; escapes <, >, &
	return template.CSS(css.String()), template.HTML(b.String()), template.JS(js)
}

// fmtMS formats milliseconds for people.
func fmtMS(v float64) string {
	d := time.Duration(v * float64(time.Millisecond))
	switch {
	case d < 0:
		return "-" + fmtMS(-v)
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}

// fmtAge formats how long before now t was.
func fmtAge(t, now time.Time) string {
	if t.IsZero() {
		return "–"
	}
	return fmtMS(ms(now.Sub(t)))
}

// fmtRate formats a per-second rate ("–" when unknown).
func fmtRate(r *float64) string {
	switch {
	case r == nil:
		return "–"
	case *r >= 1e6:
		return fmt.Sprintf("%.2fM/s", *r/1e6)
	case *r >= 1e4:
		return fmt.Sprintf("%.1fk/s", *r/1e3)
	default:
		return fmt.Sprintf("%.0f/s", *r)
	}
}

// fmtLag shows the lease deadline lag, red at or below the detach margin
// and amber below twice the margin.
func fmtLag(s Self) template.HTML {
	if s.LeaseDeadlineLagMS == nil {
		return `<span class="muted">–</span>`
	}
	lag, class := *s.LeaseDeadlineLagMS, ""
	switch {
	case lag <= s.DetachMarginMS:
		class = "bad"
	case lag < 2*s.DetachMarginMS:
		class = "warn"
	}
	return template.HTML(fmt.Sprintf(`<span class="%s">%s</span>`, class, template.HTMLEscapeString(fmtMS(lag))))
}

// phasePill shows a runner's phase: green attached, red detached.
func phasePill(s Self) template.HTML {
	class := "pill"
	switch {
	case s.Attached:
		class += " ok"
	case s.Detached != nil:
		class += " bad"
	case s.Gateway != nil && s.Gateway.Ready:
		return template.HTML(fmt.Sprintf(`<span class="pill ok">%s</span>`, template.HTMLEscapeString(s.Gateway.Reason)))
	case s.ClientOnly && s.Phase == "routing":
		class += " warn" // routing, but not ready: the reason is in the gateway line
	default:
		class += " warn"
	}
	return template.HTML(fmt.Sprintf(`<span class="%s">%s</span>`, class, template.HTMLEscapeString(s.Phase)))
}

// headline is the part of an error before its first colon ("unreachable").
func headline(s string) string {
	h, _, _ := strings.Cut(s, ":")
	return trim(h, 60)
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
