package debugpage

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
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
// reading the source.
func TestHandlerReadOnly(t *testing.T) {
	src := &fakeSource{snap: clusterSnapshot()}
	h := Handler(src, Config{})
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		if w := serve(t, h, m, "/"); w.Code != http.StatusMethodNotAllowed || w.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s: %d, Allow %q; want 405, GET, HEAD", m, w.Code, w.Header().Get("Allow"))
		}
	}
	if n := src.calls.Load(); n != 0 {
		t.Errorf("refused requests took %d snapshots", n)
	}
	if w := serve(t, h, http.MethodGet, "/?format=json"); w.Code != http.StatusOK || src.calls.Load() != 1 {
		t.Errorf("GET: %d after %d snapshots, want 200 after 1", w.Code, src.calls.Load())
	}
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
// peer does not fetch its own peers in turn), a restarted peer is flagged,
// and a peer that does not answer is unreachable once PeerTimeout passed.
func TestHandlerPeers(t *testing.T) {
	var bRequests, cRequests atomic.Int32
	urls := map[string]string{}
	peerURL := func(id string) string { return urls[id] }
	b := clusterSnapshot()
	b.ID, b.Incarnation = "b", "b-inc"
	bSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		bRequests.Add(1)
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
