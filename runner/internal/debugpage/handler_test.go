package debugpage

import (
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// fakeSource returns a fixed snapshot and counts the calls.
type fakeSource struct {
	snap  Snapshot
	calls atomic.Int32
}

func (f *fakeSource) Snapshot() Snapshot {
	f.calls.Add(1)
	return f.snap
}

func serve(t *testing.T, h http.Handler, method, target string) *httptest.ResponseRecorder {
	t.Helper()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, target, nil))
	return w
}

func decode(t *testing.T, w *httptest.ResponseRecorder) State {
	t.Helper()
	dec := json.NewDecoder(w.Body)
	dec.DisallowUnknownFields()
	var st State
	if err := dec.Decode(&st); err != nil {
		t.Fatalf("decode: %v", err)
	}
	return st
}

// TestHandlerReadOnly: anything but GET and HEAD is refused without
// reading the source; a GET reads it once (the handler read it once more
// when it was made: the rates' first sample).
func TestHandlerReadOnly(t *testing.T) {
	src := &fakeSource{snap: clusterSnapshot()}
	h := Handler(src, Config{})
	if n := src.calls.Load(); n != 1 {
		t.Errorf("making the handler took %d snapshots, want 1", n)
	}
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		if w := serve(t, h, m, "/"); w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: %d, Allow %q; want 405, GET, HEAD", m, w.Code, w.Header().Get("Allow"))
		}
	}
	if n := src.calls.Load(); n != 1 {
		t.Errorf("refused requests took %d snapshots", n-1)
	}
	if w := serve(t, h, http.MethodGet, "/?format=json"); w.Code != http.StatusOK || src.calls.Load() != 2 {
		t.Errorf("GET: %d after %d snapshots, want 200 after 1", w.Code, src.calls.Load()-1)
	}
}

// countingSource is a source whose kinds' counters the test moves.
type countingSource struct {
	mu   sync.Mutex
	snap Snapshot
}

func (c *countingSource) Snapshot() Snapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.snap
	s.Kinds = slices.Clone(s.Kinds)
	return s
}

func (c *countingSource) handled(n uint64) {
	c.mu.Lock()
	c.snap.Kinds[0].Handled = n
	c.mu.Unlock()
}

// TestFirstRequestShowsRates: the first request to a handler made a while
// ago shows message rates (over the time since it was made), not "–".
func TestFirstRequestShowsRates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &countingSource{snap: clusterSnapshot()}
		src.snap.Kinds = []KindCount{{Name: "counter", Handled: 100}}
		h := Handler(src, Config{})
		time.Sleep(2 * time.Second)
		src.handled(700)
		st := decode(t, serve(t, h, http.MethodGet, "/?format=json&peers=0"))
		if r := st.Self.MessagesPerSec; r == nil || *r != 300 {
			t.Errorf("first request: messages_per_s %v, want 300 (600 messages in the 2 s since the handler was made)", r)
		}
		if r := st.Kinds[0].MessagesPerSec; r == nil || *r != 300 {
			t.Errorf("first request: kind counter's messages_per_s %v, want 300", r)
		}
		w := serve(t, h, http.MethodGet, "/?peers=0")
		row := w.Body.String()
		row = row[strings.Index(row, "<span>messages</span>"):]
		if row = row[:strings.Index(row, "</div>")]; !strings.Contains(row, "(300/s)") {
			t.Errorf("page's messages line %q, want the rate 300/s", row)
		}
	})
}

// TestPeersFromPublishedURLs: without PeerURL, each runner's state is
// fetched from the debug URL its record publishes; a runner whose page
// does not answer (its process is gone) is unreachable and its shards are
// marked; with PeerURL, the published URLs are not used at all.
func TestPeersFromPublishedURLs(t *testing.T) {
	b := clusterSnapshot()
	b.ID, b.Incarnation = "b", "b-inc"
	bSrv := httptest.NewServer(Handler(&fakeSource{snap: b}, Config{}))
	defer bSrv.Close()
	c := clusterSnapshot()
	c.ID, c.Incarnation = "c", "c-inc"
	cSrv := httptest.NewServer(Handler(&fakeSource{snap: c}, Config{}))
	defer cSrv.Close()

	a := clusterSnapshot()
	a.Members[1].DebugURL = bSrv.URL + "/debug/"
	a.Members[2].DebugURL = "http://" + deadAddr(t) + "/debug/"
	h := Handler(&fakeSource{snap: a}, Config{})
	st := decode(t, serve(t, h, http.MethodGet, "/?format=json"))
	if r := st.Runners[1]; r.State == nil || r.State.ID != "b" || r.StateError != "" || r.URL != a.Members[1].DebugURL {
		t.Errorf("b's row: state %+v, error %q, url %q; want b's own state from its published URL", r.State, r.StateError, r.URL)
	}
	if r := st.Runners[2]; r.State != nil || !strings.HasPrefix(r.StateError, "unreachable") {
		t.Errorf("c's row (nothing listens at its URL): state %+v, error %q; want unreachable", r.State, r.StateError)
	}
	page := serve(t, h, http.MethodGet, "/?part=body").Body.String()
	if !strings.Contains(page, `class="pill warn" title="unreachable`) {
		t.Errorf("the page does not mark c unreachable:\n%s", page)
	}

	h = Handler(&fakeSource{snap: a}, Config{PeerURL: func(id string) string {
		if id == "c" {
			return cSrv.URL + "/"
		}
		return ""
	}})
	st = decode(t, serve(t, h, http.MethodGet, "/?format=json"))
	if r := st.Runners[2]; r.State == nil || r.State.ID != "c" || r.URL != cSrv.URL+"/" {
		t.Errorf("c's row with PeerURL: state %+v, error %q, url %q; want c's state from PeerURL's URL", r.State, r.StateError, r.URL)
	}
	if r := st.Runners[1]; r.State != nil || r.StateError != "" || r.URL != "" {
		t.Errorf("b's row with a PeerURL that knows only c: state %+v, error %q, url %q; want none (PeerURL alone decides)", r.State, r.StateError, r.URL)
	}
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

var cell = regexp.MustCompile(`<i class="([^"]*)"></i>`)

// TestHandlerShardGrid: the page has one cell per shard, classed by owner
// (c<index>, u unowned, x unknown lease), with handoffs (h) and moves (m)
// marked, and the owner's cells marked d when its page does not answer.
func TestHandlerShardGrid(t *testing.T) {
	s := clusterSnapshot()
	s.Handoffs = s.Handoffs[:1] // shard 1: a -> b, warming
	h := Handler(&fakeSource{snap: s}, Config{PeerURL: func(id string) string {
		if id == "b" {
			return "http://127.0.0.1:1/" // nothing listens on port 1
		}
		return ""
	}})
	w := serve(t, h, http.MethodGet, "/?part=body")
	if ct := w.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type %q", ct)
	}
	body := w.Body.String()
	grid := body[strings.Index(body, `id="grid"`):]
	grid = grid[:strings.Index(grid, "</div>")]
	var got []string
	for _, m := range cell.FindAllStringSubmatch(grid, -1) {
		got = append(got, m[1])
	}
	want := []string{"c0", "c0 h", "c1 d m", "x m", "x m", "u m", "u", "u"}
	if !slices.Equal(got, want) {
		t.Errorf("cells %q, want %q", got, want)
	}
	if strings.Contains(body, "<html") {
		t.Error("?part=body served the whole page")
	}
}

// TestHandlerPeers: each peer's own state is fetched with peers=0 (so a
// peer does not fetch its own peers in turn) and part=self (so it sends
// no shard map), a restarted peer is flagged, and a peer that does not
// answer is unreachable once PeerTimeout passed.
func TestHandlerPeers(t *testing.T) {
	var bRequests, cRequests atomic.Int32
	var bQuery atomic.Value
	urls := map[string]string{}
	peerURL := func(id string) string { return urls[id] }
	b := clusterSnapshot()
	b.ID, b.Incarnation = "b", "b-inc"
	bSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		bRequests.Add(1)
		bQuery.Store(req.URL.RawQuery)
		Handler(&fakeSource{snap: b}, Config{PeerURL: peerURL}).ServeHTTP(w, req)
	}))
	defer bSrv.Close()
	c := clusterSnapshot()
	c.ID, c.Incarnation = "c", "c-restarted"
	cSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		cRequests.Add(1)
		Handler(&fakeSource{snap: c}, Config{PeerURL: peerURL}).ServeHTTP(w, req)
	}))
	defer cSrv.Close()
	urls["b"], urls["c"] = bSrv.URL+"/", cSrv.URL+"/"

	h := Handler(&fakeSource{snap: clusterSnapshot()}, Config{PeerURL: peerURL})
	st := decode(t, serve(t, h, http.MethodGet, "/?format=json"))
	if r := st.Runners[0]; r.State == nil || r.State.ID != "a" || r.StateError != "" {
		t.Errorf("own row: state %+v, error %q; want its own", r.State, r.StateError)
	}
	if r := st.Runners[1]; r.State == nil || r.State.ID != "b" || r.StateError != "" || r.URL != urls["b"] {
		t.Errorf("b's row: state %+v, error %q, url %q; want b's own state", r.State, r.StateError, r.URL)
	}
	if r := st.Runners[2]; r.State == nil || r.StateError != "another incarnation answers (restarted?)" {
		t.Errorf("c's row: state %+v, error %q; want c's state, flagged as another incarnation", r.State, r.StateError)
	}
	if nb, nc := bRequests.Load(), cRequests.Load(); nb != 1 || nc != 1 {
		t.Errorf("b served %d requests, c %d; want 1 each (peers=0 stops the fan-out)", nb, nc)
	}
	if q, _ := url.ParseQuery(bQuery.Load().(string)); q.Get("part") != "self" || q.Get("peers") != "0" {
		t.Errorf("b was asked %q, want part=self and peers=0", bQuery.Load())
	}
	if st := decode(t, serve(t, h, http.MethodGet, "/?format=json&peers=0")); st.Runners[1].State != nil || bRequests.Load() != 1 {
		t.Errorf("peers=0: b's state %+v after %d requests to b, want none fetched", st.Runners[1].State, bRequests.Load())
	}

	// A peer that hangs: the request still ends after PeerTimeout.
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-req.Context().Done():
		case <-release:
		}
	}))
	defer hung.Close()
	defer close(release)
	urls["b"] = hung.URL + "/"
	h = Handler(&fakeSource{snap: clusterSnapshot()}, Config{PeerURL: peerURL, PeerTimeout: 100 * time.Millisecond})
	start := time.Now()
	st = decode(t, serve(t, h, http.MethodGet, "/?format=json"))
	if r := st.Runners[1]; r.State != nil || !strings.HasPrefix(r.StateError, "unreachable") {
		t.Errorf("hung peer: state %+v, error %q; want unreachable", r.State, r.StateError)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the request took %v with a peer timeout of 100 ms", took)
	}
}

// TestHandlerSelfOnly: ?part=self answers JSON with the schema, the time
// and the runner's own state only — no runners, shard map or events — and
// fetches no peer.
func TestHandlerSelfOnly(t *testing.T) {
	var peerRequests atomic.Int32
	peer := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { peerRequests.Add(1) }))
	defer peer.Close()
	h := Handler(&fakeSource{snap: clusterSnapshot()}, Config{PeerURL: func(string) string { return peer.URL }})
	w := serve(t, h, http.MethodGet, "/?part=self")
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("?part=self: Content-Type %q, want application/json", ct)
	}
	st := decode(t, w)
	if st.Schema != Schema || st.Self.ID != "a" || st.Self.Owned != 2 || st.Time.IsZero() {
		t.Errorf("?part=self: schema %q, self %+v, time %v; want a's own state", st.Schema, st.Self, st.Time)
	}
	if st.Runners != nil || st.Shards.Owner != nil || st.Shards.Count != 0 || st.Events != nil || st.Handoffs != nil {
		t.Errorf("?part=self carries more than self: %d runners, %d shard owners, %d events, %d handoffs",
			len(st.Runners), len(st.Shards.Owner), len(st.Events), len(st.Handoffs))
	}
	if n := peerRequests.Load(); n != 0 {
		t.Errorf("?part=self fetched peers %d times, want none", n)
	}
}
