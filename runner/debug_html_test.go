package runner_test

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"golang.org/x/net/html"
)

// The debug page's HTML: parsed, and checked element by element.

// parse parses an HTML document or fragment.
func parse(t *testing.T, b []byte) *html.Node {
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

// find returns the elements below n for which match holds, in document order.
func find(n *html.Node, match func(*html.Node) bool) []*html.Node {
	var out []*html.Node
	for c := range n.Descendants() {
		if c.Type == html.ElementNode && match(c) {
			out = append(out, c)
		}
	}
	return out
}

func byID(n *html.Node, id string) *html.Node {
	if m := find(n, func(c *html.Node) bool { return attr(c, "id") == id }); len(m) > 0 {
		return m[0]
	}
	return nil
}

// gridCells returns the class of every cell of the shard grid.
func gridCells(t *testing.T, doc *html.Node) []string {
	t.Helper()
	grid := byID(doc, "grid")
	if grid == nil {
		t.Fatal("no #grid element")
	}
	var cells []string
	for c := range grid.ChildNodes() {
		if c.Type == html.ElementNode && c.Data == "i" {
			cells = append(cells, attr(c, "class"))
		}
	}
	return cells
}

func runnerRows(doc *html.Node) []string {
	var ids []string
	for _, tr := range find(doc, func(c *html.Node) bool { return c.Data == "tr" && attr(c, "class") == "runner" }) {
		ids = append(ids, attr(tr, "data-id"))
	}
	return ids
}

// TestDebugPageHTML: the page lists the runners and has one grid cell per
// shard coloured by its owner, loads nothing from elsewhere, serves its
// body alone for the refresh, compresses, and refuses writes.
func TestDebugPageHTML(t *testing.T) {
	const n = 64
	nodes, _ := debugCluster(t, n, "a", "b", "c")
	url := nodes[1].srv.URL + "/"
	page := get(t, url)
	doc := parse(t, page)
	if got := runnerRows(doc); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("runner rows %v, want a b c", got)
	}
	st := getState(t, url+"?format=json")
	cells := gridCells(t, doc)
	if len(cells) != n {
		t.Fatalf("%d grid cells, want %d", len(cells), n)
	}
	for s, class := range cells {
		if want := fmt.Sprintf("c%d", st.Shards.Owner[s]); class != want {
			t.Errorf("cell %d has class %q, want %q (owner %s)", s, class, want, st.Runners[st.Shards.Owner[s]].ID)
		}
	}
	if title := find(doc, func(c *html.Node) bool { return c.Data == "title" }); len(title) != 1 || !strings.Contains(title[0].FirstChild.Data, "b") {
		t.Errorf("title %v, want one naming runner b", title)
	}
	// Self-contained: no external script, style sheet, image or frame.
	for _, el := range find(doc, func(c *html.Node) bool {
		return (c.Data == "script" && attr(c, "src") != "") || c.Data == "link" || c.Data == "img" || c.Data == "iframe"
	}) {
		t.Errorf("the page loads an external asset: <%s %v>", el.Data, el.Attr)
	}
	for _, s := range find(doc, func(c *html.Node) bool { return c.Data == "script" && attr(c, "type") == "" }) {
		if s.FirstChild == nil || !strings.Contains(s.FirstChild.Data, "refresh") {
			t.Error("inline script without the refresh logic")
		}
	}
	// The refresh fetches the body alone.
	body := get(t, url+"?part=body")
	if bytes.Contains(body, []byte("<html")) || bytes.Contains(body, []byte("<script>")) {
		t.Error("?part=body returned a whole page")
	}
	if cells := gridCells(t, parse(t, body)); len(cells) != n {
		t.Errorf("?part=body has %d cells, want %d", len(cells), n)
	}

	// gzip when asked for.
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("Content-Encoding %q, want gzip", resp.Header.Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	unzipped, err := io.ReadAll(zr)
	if err != nil || !bytes.Contains(unzipped, []byte(`id="grid"`)) {
		t.Errorf("gzip body: %v, grid present %v", err, bytes.Contains(unzipped, []byte(`id="grid"`)))
	}
	// JSON by Accept header.
	req, _ = http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "application/json")
	resp2, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp2.Body.Close()
	if ct := resp2.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Accept: application/json gave %q", ct)
	}
	// A peer whose page does not answer: its row says so, its shards are
	// marked (d) in the map.
	nodes[2].srv.Close()
	st = getState(t, url+"?format=json")
	if r := st.Runners[2]; r.State != nil || !strings.HasPrefix(r.StateError, "unreachable") {
		t.Errorf("runner c with its page down: state %v, error %q; want unreachable", r.State, r.StateError)
	}
	for s, class := range gridCells(t, parse(t, get(t, url))) {
		want := fmt.Sprintf("c%d", st.Shards.Owner[s])
		if st.Shards.Owner[s] == 2 {
			want += " d"
		}
		if class != want {
			t.Errorf("with c unreachable, cell %d has class %q, want %q", s, class, want)
		}
	}

	// Read-only.
	resp3, err := http.Post(url, "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp3.Body.Close()
	if resp3.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %s, want 405", resp3.Status)
	}
}
