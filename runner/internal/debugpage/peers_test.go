package debugpage

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// credentialsTransport adds basic-auth credentials to every request, as
// an operator's DebugConfig.HTTPClient does for pages behind a middleware.
type credentialsTransport struct{}

func (credentialsTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.SetBasicAuth("operator", "s3cret")
	return http.DefaultTransport.RoundTrip(r)
}

// peerPage is a runner's debug page that records the Authorization header
// of each request it gets.
type peerPage struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
}

func newPeerPage(t *testing.T, id string) *peerPage {
	t.Helper()
	snap := clusterSnapshot()
	snap.ID, snap.Incarnation = id, id+"-inc"
	p := &peerPage{}
	h := Handler(&fakeSource{snap: snap}, Config{})
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		p.mu.Lock()
		p.auths = append(p.auths, req.Header.Get("Authorization"))
		p.mu.Unlock()
		h.ServeHTTP(w, req)
	}))
	t.Cleanup(p.Close)
	return p
}

func (p *peerPage) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.auths...)
}

// TestPublishedURLsGetNoCredentials: the URL a runner record publishes
// (chosen by whoever may write the namespace) is fetched without the
// credentials of DebugConfig.HTTPClient; the URL PeerURL returns is
// fetched with them.
func TestPublishedURLsGetNoCredentials(t *testing.T) {
	b := newPeerPage(t, "b")
	a := clusterSnapshot()
	a.Members[1].DebugURL = b.URL + "/"
	client := &http.Client{Transport: credentialsTransport{}}

	st := decode(t, serve(t, Handler(&fakeSource{snap: a}, Config{HTTPClient: client}), http.MethodGet, "/?format=json"))
	if r := st.Runners[1]; r.State == nil || r.State.ID != "b" {
		t.Fatalf("b's row from its published URL: state %+v, error %q; want b's state", r.State, r.StateError)
	}
	if got := b.requests(); len(got) != 1 || got[0] != "" {
		t.Errorf("b's page got Authorization %q from a fetch of its published URL, want one request without", got)
	}

	h := Handler(&fakeSource{snap: a}, Config{HTTPClient: client, PeerURL: func(id string) string {
		if id == "b" {
			return b.URL + "/"
		}
		return ""
	}})
	st = decode(t, serve(t, h, http.MethodGet, "/?format=json"))
	if r := st.Runners[1]; r.State == nil || r.State.ID != "b" {
		t.Fatalf("b's row from PeerURL: state %+v, error %q; want b's state", r.State, r.StateError)
	}
	if got := b.requests(); len(got) != 2 || !strings.HasPrefix(got[1], "Basic ") {
		t.Errorf("b's page got Authorization %q, want the operator's credentials on the fetch of PeerURL's URL", got)
	}
}

// TestPeerRedirectsStayOnTheirHost: a peer's page that redirects to
// another host is not followed there (with or without credentials); a
// redirect within its own host is.
func TestPeerRedirectsStayOnTheirHost(t *testing.T) {
	elsewhere := newPeerPage(t, "b")
	b := newPeerPage(t, "b")
	redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		switch req.URL.Path {
		case "/away/":
			http.Redirect(w, req, elsewhere.URL+"/?"+req.URL.RawQuery, http.StatusFound)
		case "/moved/":
			http.Redirect(w, req, "/debug/?"+req.URL.RawQuery, http.StatusMovedPermanently)
		default:
			b.Config.Handler.ServeHTTP(w, req)
		}
	}))
	defer redirector.Close()
	for _, published := range []bool{false, true} {
		// b's row when its URL (published, or PeerURL's) is path on the
		// redirecting server.
		row := func(path string) Runner {
			a := clusterSnapshot()
			cfg := Config{HTTPClient: &http.Client{Transport: credentialsTransport{}}}
			if published {
				a.Members[1].DebugURL = redirector.URL + path
			} else {
				cfg.PeerURL = func(id string) string { return map[string]string{"b": redirector.URL + path}[id] }
			}
			return decode(t, serve(t, Handler(&fakeSource{snap: a}, cfg), http.MethodGet, "/?format=json")).Runners[1]
		}
		if r := row("/away/"); r.State != nil || !strings.Contains(r.StateError, "redirect refused") {
			t.Errorf("published %v: b's page redirecting to another host: state %+v, error %q; want the redirect refused", published, r.State, r.StateError)
		}
		if got := elsewhere.requests(); len(got) != 0 {
			t.Errorf("published %v: the other host got %d requests (Authorization %q), want none", published, len(got), got)
		}
		if r := row("/moved/"); r.State == nil || r.State.ID != "b" {
			t.Errorf("published %v: b's page redirecting within its host: state %+v, error %q; want b's state", published, r.State, r.StateError)
		}
	}
}

// TestPublishedURLWithCredentialsIsNotUsed: a runner record whose debug
// URL carries credentials (runners refuse such a DebugURL at start; this
// one was written by another hand) is neither fetched nor shown with them.
func TestPublishedURLWithCredentialsIsNotUsed(t *testing.T) {
	b := newPeerPage(t, "b")
	a := clusterSnapshot()
	a.Members[1].DebugURL = strings.Replace(b.URL, "http://", "http://admin:hunter2@", 1) + "/"
	h := Handler(&fakeSource{snap: a}, Config{})
	w := serve(t, h, http.MethodGet, "/?format=json")
	page := serve(t, h, http.MethodGet, "/")
	if strings.Contains(w.Body.String(), "hunter2") || strings.Contains(page.Body.String(), "hunter2") {
		t.Errorf("the page shows the published URL's password:\n%s", w.Body.String())
	}
	st := decode(t, w)
	if r := st.Runners[1]; r.State != nil || !strings.Contains(r.StateError, "carries credentials") || r.URL != b.URL+"/" {
		t.Errorf("b's row: state %+v, error %q, url %q; want not fetched, shown as %q", r.State, r.StateError, r.URL, b.URL+"/")
	}
	if got := b.requests(); len(got) != 0 {
		t.Errorf("b's page got %d requests, want none", len(got))
	}
}
