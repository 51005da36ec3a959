package runner_test

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// requireBasicAuth lets through the requests that carry user and password
// (compared in constant time); the others get 401 and a challenge, so a
// browser asks for them.
func requireBasicAuth(user, password string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || subtle.ConstantTimeCompare([]byte(u), []byte(user)) != 1 ||
			subtle.ConstantTimeCompare([]byte(p), []byte(password)) != 1 {
			w.Header().Set("WWW-Authenticate", `Basic realm="shardhost debug", charset="UTF-8"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// basicAuthTransport adds credentials to the requests of the debug
// handler's own client, which fetches the peers' pages at the URLs
// DebugConfig.PeerURL gives when they sit behind the same middleware.
type basicAuthTransport struct{ user, password string }

func (t basicAuthTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.SetBasicAuth(t.user, t.password)
	return http.DefaultTransport.RoundTrip(r)
}

// The debug page shows the cluster's runners (IDs, transport addresses,
// leases), the shard map and recent events to whoever reaches it: mount
// it behind the program's own authentication. The handler itself only
// reads (GET and HEAD; other methods get 405).
func ExampleRunner_DebugHandler() {
	store := memory.New()
	defer store.Cluster().Close()
	r, err := runner.New(store, runner.Config{ID: "runner-1", NumShards: 16, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	go r.Run(context.Background())
	defer r.Shutdown(context.Background())
	<-r.Ready()

	const user, password = "operator", "s3cret" // from the program's secrets in practice
	mux := http.NewServeMux()
	mux.Handle("/debug/shardhost/", requireBasicAuth(user, password, r.DebugHandler(runner.DebugConfig{
		// The credentials go to the URLs PeerURL gives, and to no other:
		// the URLs runners publish in the store (Config.DebugURL) are
		// fetched without them, as whoever may write the namespace can
		// choose those.
		PeerURL:    func(id string) string { return "https://" + id + ".debug.internal/debug/shardhost/" },
		HTTPClient: &http.Client{Transport: basicAuthTransport{user, password}},
	})))
	srv := httptest.NewServer(mux) // in production: an http.Server on an internal address
	defer srv.Close()

	get := func(method string, auth bool) *http.Response {
		req, _ := http.NewRequest(method, srv.URL+"/debug/shardhost/?format=json", strings.NewReader(""))
		if auth {
			req.SetBasicAuth(user, password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		return resp
	}
	resp := get(http.MethodGet, false)
	resp.Body.Close()
	fmt.Println("no credentials:", resp.StatusCode)

	resp = get(http.MethodGet, true)
	var st runner.DebugState
	_ = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	fmt.Println("GET with credentials:", resp.StatusCode, st.Schema, st.Self.ID)

	resp = get(http.MethodPost, true)
	resp.Body.Close()
	fmt.Println("POST with credentials:", resp.StatusCode, resp.Header.Get("Allow"))
	// Output:
	// no credentials: 401
	// GET with credentials: 200 shardhost.debug/v1 runner-1
	// POST with credentials: 405 GET, HEAD
}
