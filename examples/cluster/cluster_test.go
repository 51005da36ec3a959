//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
)

// proc is one process of the cluster under test.
type proc struct {
	name string
	args []string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// start starts bin with args as a child that dies with the test binary,
// logging to dir/name.log.
func start(t *testing.T, dir, bin, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, args: args, log: filepath.Join(dir, name+".log"), done: make(chan struct{})}
	f, err := os.OpenFile(p.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM) // graceful: a runner hands off first
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			b, _ := os.ReadFile(p.log)
			t.Logf("--- %s log:\n%s", name, tail(string(b), 3000))
		}
	})
	return p
}

// kill sends SIGKILL and waits for the process to exit.
func (p *proc) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

// built holds the programs the tests run, each built once per test binary
// (go build links anew every time it is asked) in a directory TestMain
// removes.
var built struct {
	sync.Mutex
	dir  string
	bins map[string]string // pkg -> executable
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// goBuild returns pkg built as an executable named name, building it on
// first use (without -race: the processes are the example, not the code
// under the race detector).
func goBuild(t *testing.T, name, pkg string) string {
	t.Helper()
	built.Lock()
	defer built.Unlock()
	if bin, ok := built.bins[pkg]; ok {
		return bin
	}
	if built.dir == "" {
		dir, err := os.MkdirTemp("", "shardhost-examples-cluster-")
		if err != nil {
			t.Fatal(err)
		}
		built.dir, built.bins = dir, map[string]string{}
	}
	out := filepath.Join(built.dir, name)
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	built.bins[pkg] = out
	return out
}

// state fetches a process's debug state.
func state(url string) (runner.DebugState, error) {
	var st runner.DebugState
	resp, err := http.Get(url + "?format=json")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("%s: %s", url, resp.Status)
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	return st, err
}

// waitState polls url's debug state until cond holds (at most d).
func waitState(t *testing.T, url string, d time.Duration, what string, cond func(runner.DebugState) bool) runner.DebugState {
	t.Helper()
	for p := testenv.NewPatience(d); ; p.Sleep(100 * time.Millisecond) {
		st, err := state(url)
		if err == nil && cond(st) {
			return st
		}
		if p.Over() {
			t.Fatalf("timed out after %v waiting for %s (last state: %v, %+v)", p, what, err, summary(st))
		}
	}
}

func summary(st runner.DebugState) string {
	var b strings.Builder
	fmt.Fprintf(&b, "shards owned %d unowned %d moves %d; runners:", st.Shards.Owned, st.Shards.Unowned, len(st.Shards.Moves))
	for _, r := range st.Runners {
		phase := "?"
		if r.State != nil {
			phase = r.State.Phase
		}
		fmt.Fprintf(&b, " %s(%s, %d owned, %s)", r.ID, phase, r.Owned, r.StateError)
	}
	return b.String()
}

// healthy: the runners ids, all attached as their peers report, own every
// shard where the assignment wants it.
func healthy(ids ...string) func(runner.DebugState) bool {
	return func(st runner.DebugState) bool {
		if len(st.Runners) != len(ids) || st.Shards.Owned != st.Shards.Count || len(st.Shards.Moves) != 0 || len(st.Handoffs) != 0 {
			return false
		}
		for i, r := range st.Runners {
			if r.ID != ids[i] || r.State == nil || !r.State.Attached || r.Owned == 0 {
				return false
			}
		}
		return true
	}
}

// screenshot takes a picture of url into $SHARDHOST_SCREENSHOTS/name
// (`make screenshots` points it at docs/); without it, none: a picture is
// not a check, and make test takes none.
func screenshot(b *testenv.Browser, url, name string, budget time.Duration) {
	if dir := os.Getenv("SHARDHOST_SCREENSHOTS"); dir != "" {
		b.Screenshot(url, filepath.Join(dir, name), 1280, 1000, budget)
	}
}

// checkDOM loads url in the browser and checks the rendered page: the
// script refreshed it, the runner rows are ids, each with a message rate
// (the first load shows rates), and the grid has one cell per shard with
// no unowned one.
func checkDOM(t *testing.T, b *testenv.Browser, url string, shards int, ids ...string) {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(b.Load(url, 5*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	var rows []string
	cells, unowned, updated := 0, 0, -1
	for n := range doc.Descendants() {
		if n.Type == html.ElementNode && n.Data == "tr" && attrOf(n, "class") == "runner" {
			if rate := rowCell(n, 8); !strings.HasSuffix(rate, "/s") {
				t.Errorf("%s: row %s shows msgs/s %q, want a rate", url, attrOf(n, "data-id"), rate)
			}
		}
	}
	for n := range doc.Descendants() {
		if n.Type != html.ElementNode {
			continue
		}
		switch {
		case n.Data == "body":
			updated, _ = strconv.Atoi(attrOf(n, "data-updated"))
		case n.Data == "tr" && attrOf(n, "class") == "runner":
			rows = append(rows, attrOf(n, "data-id"))
		case n.Data == "i" && n.Parent != nil && attrOf(n.Parent, "id") == "grid":
			cells++
			if strings.HasPrefix(attrOf(n, "class"), "u") {
				unowned++
			}
		}
	}
	if updated < 1 {
		t.Errorf("%s: the page's script never refreshed it (data-updated %d)", url, updated)
	}
	if !slices.Equal(rows, ids) {
		t.Errorf("%s: runner rows %v, want %v", url, rows, ids)
	}
	if cells != shards || unowned != 0 {
		t.Errorf("%s: %d grid cells (%d unowned), want %d, all owned", url, cells, unowned, shards)
	}
}

// rowCell returns the text of the i-th cell of table row tr.
func rowCell(tr *html.Node, i int) string {
	for td := range tr.ChildNodes() {
		if td.Type != html.ElementNode || td.Data != "td" {
			continue
		}
		if i == 0 {
			var b strings.Builder
			for n := range td.Descendants() {
				if n.Type == html.TextNode {
					b.WriteString(n.Data)
				}
			}
			return strings.TrimSpace(b.String())
		}
		i--
	}
	return ""
}

// checkKilled loads url in the browser right after runner dead was killed
// and checks that the first page shows it unreachable (its state pill) and
// hatches its shards as owned by a runner that is gone (class d), while
// the survivors stay attached.
func checkKilled(t *testing.T, b *testenv.Browser, url, dead string) {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(b.Load(url, 500*time.Millisecond)))
	if err != nil {
		t.Fatal(err)
	}
	deadIdx, marked, hatched, others := "", false, 0, 0
	for n := range doc.Descendants() {
		if n.Type != html.ElementNode {
			continue
		}
		switch {
		case n.Data == "tr" && attrOf(n, "class") == "runner":
			state := rowCell(n, 1)
			if attrOf(n, "data-id") == dead {
				deadIdx, marked = attrOf(n, "data-idx"), strings.Contains(state, "unreachable")
			} else if !strings.Contains(state, "attached") {
				t.Errorf("%s: survivor %s shows state %q, want attached", url, attrOf(n, "data-id"), state)
			}
		case n.Data == "i" && n.Parent != nil && attrOf(n.Parent, "id") == "grid":
			classes := strings.Fields(attrOf(n, "class"))
			switch {
			case len(classes) > 0 && classes[0] == "c"+deadIdx && slices.Contains(classes, "d"):
				hatched++
			case slices.Contains(classes, "d"):
				others++
			}
		}
	}
	if deadIdx == "" || !marked {
		t.Errorf("%s right after kill -9 of %s: its row is missing or not marked unreachable", url, dead)
	}
	if hatched == 0 || others != 0 {
		t.Errorf("%s right after kill -9 of %s: %d of its cells hatched, %d of others; want all of its own and no other", url, dead, hatched, others)
	}
}

func attrOf(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// TestClusterProcesses runs the example as the README does: etcd, three
// runner processes and a gateway, each runner publishing its debug URL in
// its record (no peer list configured anywhere); every dashboard shows the
// three runners attached with their message rates on the first load and
// the shard map complete (in headless Chromium when installed); the first
// page loaded after kill -9 of runner-2 marks its row unreachable and
// hatches its shards, which move to the others within the lease TTL, and
// shardhostctl status agrees; restarted, runner-2 takes shards again.
func TestClusterProcesses(t *testing.T) {
	const shards = 1024
	etcd := testenv.StartEtcd(t)
	dir := t.TempDir()
	bin := goBuild(t, "cluster", ".")
	ctlBin := goBuild(t, "shardhostctl", "github.com/shardhost/shardhost/cmd/shardhostctl")
	browser := testenv.TryChromium(t)

	ids := []string{"runner-1", "runner-2", "runner-3"}
	debug := map[string]string{}
	for _, id := range append([]string{"gateway"}, ids...) {
		debug[id] = "http://" + testenv.FreeAddr(t) + DebugPath
	}
	// The lease TTL leaves the browser checks after the kill time to run
	// (a loaded machine starts Chromium in seconds) before the killed
	// runner's record expires.
	const ttl = 15 * time.Second
	common := []string{"-etcd", etcd.Endpoint(), "-namespace", "demo", "-shards", strconv.Itoa(shards), "-ttl", ttl.String()}
	addr := func(id string) string { return strings.TrimSuffix(strings.TrimPrefix(debug[id], "http://"), DebugPath) }
	procs := map[string]*proc{}
	for _, id := range ids {
		procs[id] = start(t, dir, bin, id, append([]string{"-role", "runner", "-id", id, "-debug", addr(id)}, common...)...)
	}
	gw := start(t, dir, bin, "gateway", append([]string{"-role", "gateway", "-debug", addr("gateway"), "-rate", "300", "-report", "500ms"}, common...)...)

	waitState(t, debug["gateway"], 60*time.Second, "3 attached runners owning every shard, seen by the gateway", healthy(ids...))
	st := waitState(t, debug["runner-1"], 20*time.Second, "traffic handled on every runner", func(st runner.DebugState) bool {
		for _, r := range st.Runners {
			if r.State == nil || r.State.Messages == 0 {
				return false
			}
		}
		return healthy(ids...)(st)
	})
	if len(st.Kinds) != 1 || st.Kinds[0].Kind != "counter" || st.Kinds[0].Active == 0 {
		t.Errorf("runner-1 kinds = %+v, want active counters", st.Kinds)
	}
	if browser != nil {
		checkDOM(t, browser, debug["runner-1"], shards, ids...)
		checkDOM(t, browser, debug["gateway"], shards, ids...)
		screenshot(browser, debug["runner-1"], "dashboard.png", 3*time.Second)
	}

	// kill -9 runner-2: its record stays until its lease expires, and its
	// page does not answer.
	procs["runner-2"].kill(t)
	killed := time.Now()
	st, err := state(debug["runner-1"])
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(st.Runners, func(r runner.DebugRunner) bool { return r.ID == "runner-2" }); i < 0 ||
		!strings.HasPrefix(st.Runners[i].StateError, "unreachable") {
		t.Errorf("right after kill -9 (lease TTL %v): runner-2 in runner-1's view = %+v, want its row, unreachable", ttl, summary(st))
	}
	if st, err := state(debug["gateway"]); err != nil || !slices.ContainsFunc(st.Runners, func(r runner.DebugRunner) bool {
		return r.ID == "runner-2" && strings.HasPrefix(r.StateError, "unreachable")
	}) {
		t.Errorf("right after kill -9: the gateway's view = %+v (%v), want runner-2 unreachable", summary(st), err)
	}
	if browser != nil {
		checkKilled(t, browser, debug["runner-1"], "runner-2")
		screenshot(browser, debug["runner-1"], "dashboard-kill.png", 500*time.Millisecond)
		if took := time.Since(killed); took > ttl && t.Failed() {
			t.Logf("the browser checks after the kill took %v, longer than the lease TTL: runner-2's record may have expired meanwhile", took)
		} else {
			t.Logf("the browser checks after the kill took %v (lease TTL %v)", took, ttl)
		}
	}
	survivors := []string{"runner-1", "runner-3"}
	waitState(t, debug["runner-1"], 30*time.Second, "runner-1 and runner-3 owning every shard", healthy(survivors...))
	waitState(t, debug["gateway"], 10*time.Second, "the gateway seeing the same", healthy(survivors...))
	out, err := exec.Command(ctlBin, "-endpoints", etcd.Endpoint(), "-namespace", "demo", "status", "-json").Output() // the shard count from the cluster record
	if err != nil {
		t.Fatalf("shardhostctl status: %v", err)
	}
	var status struct {
		Runners []struct{ ID string }
		Owned   int
		Unowned int
	}
	if err := json.Unmarshal(out, &status); err != nil {
		t.Fatalf("shardhostctl status -json: %v\n%s", err, out)
	}
	if len(status.Runners) != 2 || status.Runners[0].ID != "runner-1" || status.Runners[1].ID != "runner-3" || status.Owned != shards || status.Unowned != 0 {
		t.Errorf("shardhostctl status after the kill = %+v, want runner-1 and runner-3 owning all %d shards", status, shards)
	}
	if browser != nil {
		checkDOM(t, browser, debug["runner-1"], shards, survivors...)
		screenshot(browser, debug["runner-1"], "dashboard-after-kill.png", 3*time.Second)
	}

	// Start runner-2 again: it takes its share back by handoff.
	procs["runner-2"] = start(t, dir, bin, "runner-2b", procs["runner-2"].args...)
	waitState(t, debug["runner-1"], 30*time.Second, "three runners again", healthy(ids...))

	// The gateway kept serving and reports its traffic.
	b, _ := os.ReadFile(gw.log)
	if !bytes.Contains(b, []byte("asks ok")) || !bytes.Contains(b, []byte("served by runner-1")) {
		t.Errorf("gateway log has no traffic lines:\n%s", tail(string(b), 2000))
	}
}
