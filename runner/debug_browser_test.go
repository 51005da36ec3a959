package runner_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// screenshotPath returns where a browser test writes its screenshot name:
// into $SHARDHOST_SCREENSHOTS (`make screenshots` points it at docs/), or
// "" when it is not set: a screenshot proves nothing a test checks, so
// make test takes none. Only the 16 384-shard page goes to docs/ from
// here; the multi-process example takes the others.
func screenshotPath(name string) string {
	if dir := os.Getenv("SHARDHOST_SCREENSHOTS"); dir != "" {
		return filepath.Join(dir, name)
	}
	return ""
}

// TestDebugPageInBrowser loads the debug page of a 3-runner cluster in
// headless Chromium: after its script ran (at least one refresh of its own
// body) the DOM lists the 3 runners, each with its own state fetched from
// its peer, and a grid of one cell per shard coloured by owner. A second
// page, of a runner owning 16 384 shards, and one of sharding.MaxShards,
// render all their cells. Skipped without Chromium.
func TestDebugPageInBrowser(t *testing.T) {
	t.Parallel()
	b := testenv.Chromium(t)
	const n = 256
	nodes, do := debugCluster(t, n, "runner-1", "runner-2", "runner-3")
	for i := range 300 {
		if _, err := do.Ask(t.Context(), nodes[0], fmt.Sprintf("user-%d", i), whoReq{}); err != nil {
			t.Fatal(err)
		}
	}
	url := nodes[0].srv.URL + "/"
	dom := parse(t, []byte(b.Load(url, 5*time.Second)))
	body := find(dom, func(c *html.Node) bool { return c.Data == "body" })[0]
	if u, _ := strconv.Atoi(attr(body, "data-updated")); u < 1 {
		t.Errorf("body data-updated=%q: the page's script never refreshed its content", attr(body, "data-updated"))
	}
	if got := runnerRows(dom); !slices.Equal(got, []string{"runner-1", "runner-2", "runner-3"}) {
		t.Errorf("runner rows in the DOM: %v, want runner-1..3", got)
	}
	for _, tr := range find(dom, func(c *html.Node) bool { return c.Data == "tr" && attr(c, "class") == "runner" }) {
		pills := find(tr, func(c *html.Node) bool { return attr(c, "class") == "pill ok" })
		if len(pills) != 1 || pills[0].FirstChild.Data != "attached" {
			t.Errorf("row %s shows no 'attached' state", attr(tr, "data-id"))
		}
	}
	cells := gridCells(t, dom)
	if len(cells) != n {
		t.Errorf("%d grid cells in the DOM, want %d", len(cells), n)
	}
	owners := map[string]int{}
	for _, c := range cells {
		owners[strings.Fields(c)[0]]++
	}
	if len(owners) != 3 || owners["u"] != 0 {
		t.Errorf("cells by owner class %v, want 3 owners and no unowned cell", owners)
	}

	// 16 384 shards, and sharding.MaxShards.
	for _, big := range []int{16384, sharding.MaxShards} {
		_, r, _ := startOwningAll(t, runner.Config{ID: "big", NumShards: big})
		srv := newServer(t, r.DebugHandler(runner.DebugConfig{}))
		if cells := gridCells(t, parse(t, []byte(b.Load(srv.URL, 3*time.Second)))); len(cells) != big {
			t.Errorf("%d grid cells in the DOM of the %d-shard page, want %d", len(cells), big, big)
		}
		if shot := screenshotPath("dashboard-16384.png"); shot != "" && big == 16384 {
			b.Screenshot(srv.URL, shot, 1280, 1000, 3*time.Second)
			t.Logf("screenshot: %s", shot)
		}
	}
}
