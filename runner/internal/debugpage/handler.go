package debugpage

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Handler returns an http.Handler serving the debug page of src, and the
// same data as JSON with ?format=json (or Accept: application/json).
// Query parameters: format=json, pretty=1 (indented JSON), epochs=1
// (per-shard epochs in the JSON), peers=0 (do not fetch the peers'
// states), part=body (the page's body alone, for its refresh), part=self
// (JSON with only schema, time and self: what each page fetches from every
// peer, so that a page of 100 runners does not move 100 shard maps).
//
// The handler takes a first sample of the message counters when it is
// made, so that its first request already shows rates (over the time
// since then).
func Handler(src Source, cfg Config) http.Handler {
	h := &handler{src: src, cfg: cfg.withDefaults()}
	h.published = publishedClient(h.cfg.PeerTimeout)
	h.rates.update(time.Now(), counters(src.Snapshot().Kinds))
	return h
}

type handler struct {
	src       Source
	cfg       Config
	published *http.Client // fetches the URLs runners publish (peers.go)
	rates     rateSampler
}

func (h *handler) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the shardhost debug handler is read-only", http.StatusMethodNotAllowed)
		return
	}
	q := req.URL.Query()
	selfOnly := q.Get("part") == "self"
	st := h.state(req.Context(), q.Get("epochs") == "1", q.Get("peers") != "0" && !selfOnly)
	if selfOnly {
		st = &State{Schema: st.Schema, Time: st.Time, Self: st.Self}
	}
	w.Header().Set("Cache-Control", "no-store")
	out := compressed(w, req)
	defer out.Close()
	if selfOnly || q.Get("format") == "json" || (q.Get("format") == "" && q.Get("part") == "" && acceptsJSON(req)) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(out)
		if q.Get("pretty") == "1" {
			enc.SetIndent("", "  ")
		}
		_ = enc.Encode(st)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_ = render(out, st, h.cfg, q.Get("part") == "body")
}

func acceptsJSON(req *http.Request) bool {
	a := req.Header.Get("Accept")
	return strings.Contains(a, "application/json") && !strings.Contains(a, "text/html")
}

// compressed returns w, gzip-compressed when the client accepts it (a
// page of 65 536 shards of 100 runners is ~1.3 MB of HTML, ~110 KB
// compressed).
func compressed(w http.ResponseWriter, req *http.Request) io.WriteCloser {
	if !strings.Contains(req.Header.Get("Accept-Encoding"), "gzip") {
		return nopCloser{w}
	}
	w.Header().Set("Content-Encoding", "gzip")
	w.Header().Add("Vary", "Accept-Encoding")
	return gzip.NewWriter(w)
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// state takes a snapshot of the source, builds its State and, when peers
// is set, fills in every listed peer's own state (peers.go).
func (h *handler) state(ctx context.Context, epochs, peers bool) *State {
	now := time.Now()
	st := build(h.src.Snapshot(), now, epochs, &h.rates)
	var wg sync.WaitGroup
	for i := range st.Runners {
		r := &st.Runners[i]
		target, client, refused := h.peerURL(r)
		switch {
		case r.Self:
			r.State = &st.Self
		case refused != "":
			r.StateError = refused
		case target != "" && peers:
			wg.Go(func() { r.State, r.StateError = h.fetchPeer(ctx, client, r.ID, r.Incarnation, target) })
		}
	}
	wg.Wait()
	return st
}
