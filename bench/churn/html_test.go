package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/shardhost/shardhost/internal/testenv"
)

func parseHTML(t *testing.T, b []byte) *html.Node {
	t.Helper()
	doc, err := html.Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// elements returns the elements named tag below n.
func elements(n *html.Node, tag string) []*html.Node {
	var out []*html.Node
	for c := range n.Descendants() {
		if c.Type == html.ElementNode && c.Data == tag {
			out = append(out, c)
		}
	}
	return out
}

// section returns the <section> with the given id.
func section(t *testing.T, doc *html.Node, id string) *html.Node {
	t.Helper()
	for _, s := range elements(doc, "section") {
		if attr(s, "id") == id {
			return s
		}
	}
	t.Fatalf("no section %q", id)
	return nil
}

// reportHTML writes the shared run's HTML report and returns its path
// (in $SHARDHOST_SCREENSHOTS when set, for docs/).
func reportHTML(t *testing.T) (string, []byte) {
	t.Helper()
	rep := churnRun(t)
	var b bytes.Buffer
	if err := rep.writeHTML(&b); err != nil {
		t.Fatal(err)
	}
	dir := os.Getenv("SHARDHOST_SCREENSHOTS")
	if dir == "" {
		dir = t.TempDir()
	}
	path := filepath.Join(dir, "churn-report.html")
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, b.Bytes()
}

// TestChurnHTML: the report draws what the run measured: one owned-shards
// line per runner that hosted shards, a marked window per step, a bar per
// moved shard (planned and crash), latency lines, a row of costs per step,
// and the printed report; it loads nothing from elsewhere.
func TestChurnHTML(t *testing.T) {
	rep := churnRun(t)
	_, page := reportHTML(t)
	doc := parseHTML(t, page)
	if n := len(elements(doc, "svg")); n != 4 {
		t.Errorf("%d SVG charts, want 4", n)
	}
	for _, tag := range []string{"script", "link", "img", "iframe"} {
		if n := len(elements(doc, tag)); n != 0 {
			t.Errorf("%d <%s> elements, want none (self-contained, static)", n, tag)
		}
	}
	owned := section(t, doc, "owned")
	if got, want := len(elements(owned, "polygon")), len(rep.timeline.runners); got != want || want < rep.Params.Runners+1 {
		t.Errorf("%d bands of owned shards, want one per hosting runner (%d; at least %d: the first ones and the added one)", got, want, rep.Params.Runners+1)
	}
	marks := 0
	for _, r := range elements(owned, "rect") {
		if attr(r, "fill-opacity") != "" {
			marks++
		}
	}
	if marks != len(rep.Steps) {
		t.Errorf("%d step windows marked, want %d", marks, len(rep.Steps))
	}
	bars := map[string]int{}
	for _, r := range elements(section(t, doc, "moves"), "rect") {
		if title := elements(r, "title"); len(title) == 1 && attr(r, "fill-opacity") == "" {
			text := title[0].FirstChild.Data
			switch {
			case strings.Contains(text, "planned cutover"):
				bars["planned"]++
			case strings.Contains(text, "crash takeover"):
				bars["crash"]++
			}
		}
	}
	for _, k := range []string{"planned", "crash"} {
		if bars[k] != rep.Cutover[k].N || bars[k] == 0 {
			t.Errorf("%d %s bars, want one per moved shard (%d) and some", bars[k], k, rep.Cutover[k].N)
		}
	}
	if n := len(elements(section(t, doc, "latency"), "path")); n != 3 {
		t.Errorf("%d latency lines, want p50, p99 and max", n)
	}
	rows := elements(section(t, doc, "steps"), "tr")
	if len(rows) != len(rep.Steps)+1 {
		t.Errorf("%d rows in the steps' cost table, want a header and one per step (%d)", len(rows), len(rep.Steps))
	} else {
		for i, s := range rep.Steps {
			cells := elements(rows[i+1], "td")
			if len(cells) != 15 || cells[1].FirstChild.Data != s.Kind || cells[5].FirstChild.Data != strconv.Itoa(s.Cost.Moved) ||
				cells[7].FirstChild.Data != fmt.Sprintf("%.1f", s.Cost.WatchEventsPerMoved) {
				t.Errorf("step %d's row does not show its kind, moved shards and watch deliveries per moved shard (%s, %d, %.1f)",
					i+1, s.Kind, s.Cost.Moved, s.Cost.WatchEventsPerMoved)
			}
		}
	}
	pre := elements(section(t, doc, "text"), "pre")
	if len(pre) != 1 || !strings.Contains(pre[0].FirstChild.Data, "cutover per moved shard") {
		t.Error("the printed report is missing")
	}
}

// TestChurnReportInBrowser: headless Chromium renders the report's four
// charts with their lines and bars, and takes a screenshot. Skipped
// without Chromium.
func TestChurnReportInBrowser(t *testing.T) {
	b := testenv.Chromium(t)
	rep := churnRun(t)
	path, _ := reportHTML(t)
	url := "file://" + path
	doc := parseHTML(t, []byte(b.Load(url, time.Second)))
	svgs := elements(doc, "svg")
	if len(svgs) != 4 {
		t.Fatalf("%d charts in the DOM, want 4", len(svgs))
	}
	if got := len(elements(section(t, doc, "owned"), "polygon")); got != len(rep.timeline.runners) {
		t.Errorf("%d owned-shards bands in the DOM, want %d", got, len(rep.timeline.runners))
	}
	if os.Getenv("SHARDHOST_SCREENSHOTS") != "" { // a picture for docs/, not a check: make test takes none
		shot := filepath.Join(filepath.Dir(path), "churn-report.png")
		b.Screenshot(url, shot, 1200, 1500, time.Second)
		t.Log(fmt.Sprintf("screenshot: %s", shot))
	}
}
