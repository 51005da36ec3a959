package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// TestEtcdDownAtStart: a runner started while its etcd is down logs a WARN
// naming the endpoint and the connection's error (connection refused, not
// the call's deadline) with a hint at StartTimeout, is not Ready, says
// "not started: etcd ... unreachable since" in Status and on its debug
// page, and becomes Ready (and serves) once etcd is up; with StartTimeout,
// Run gives up and says why.
func TestEtcdDownAtStart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartEtcd(t)
	srv.Stop()
	k := newTestKind(false)
	newRunner := func(cfg runner.Config) *runner.Runner {
		t.Helper()
		s, err := etcd.New(testenv.NewEtcdClient(t, srv.Endpoint()), "down-at-start", etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := runner.New(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		return r
	}

	var lc logCapture
	timed := newRunner(runner.Config{ID: "timed", NumShards: 8, StartTimeout: 2 * time.Second, OpTimeout: 500 * time.Millisecond, Logger: lc.logger(t)})
	if err := timed.Run(context.Background()); !errors.Is(err, runner.ErrStartTimeout) || !errors.Is(err, storage.ErrUnavailable) ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("Run with etcd down and StartTimeout 2s = %v, want ErrStartTimeout with the connection's error", err)
	}
	warns := lc.find(slog.LevelWarn, "cannot start")
	if len(warns) != 1 || warns[0].Attrs["endpoints"] != srv.Endpoint() ||
		!strings.Contains(warns[0].Attrs["err"], "etcd unreachable: "+srv.Endpoint()+": dial tcp") ||
		!strings.Contains(warns[0].Attrs["err"], "connection refused") || !strings.Contains(warns[0].Attrs["hint"], "StartTimeout (2s)") {
		t.Fatalf("WARN lines = %v, want one naming endpoint %s, the refused connection and StartTimeout", warns, srv.Endpoint())
	}
	if errs := lc.find(slog.LevelError, "StartTimeout"); len(errs) != 1 || !strings.Contains(errs[0].Attrs["err"], "StartTimeout") {
		t.Fatalf("ERROR lines = %v, want one saying why Run stopped", errs)
	}

	r := newRunner(runner.Config{ID: "patient", NumShards: 8, OpTimeout: 500 * time.Millisecond, Logger: logger(t)})
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { r.Close(); <-done })
	select {
	case <-r.Ready():
		t.Fatal("Ready with etcd down")
	case <-time.After(time.Second):
	}
	want := "not started: etcd at " + srv.Endpoint() + " unreachable since "
	for p := testenv.NewPatience(10 * time.Second); !strings.HasPrefix(r.Status().NotStarted, want) && !p.Over(); {
		p.Sleep(50 * time.Millisecond)
	}
	if st := r.Status(); !strings.HasPrefix(st.NotStarted, want) || !strings.Contains(st.NotStarted, "connection refused") ||
		!errors.Is(st.StartError, storage.ErrUnavailable) {
		t.Fatalf("Status while etcd is down: NotStarted %q, StartError %v; want %q... naming the refused connection", st.NotStarted, st.StartError, want)
	}
	page := httptest.NewRecorder()
	r.DebugHandler(runner.DebugConfig{}).ServeHTTP(page, httptest.NewRequest(http.MethodGet, "/?format=json", nil))
	var doc runner.DebugState
	if err := json.Unmarshal(page.Body.Bytes(), &doc); err != nil || !strings.HasPrefix(doc.Self.NotStarted, want) {
		t.Fatalf("debug JSON while etcd is down: self.not_started %q (%v); want %q...", doc.Self.NotStarted, err, want)
	}
	page = httptest.NewRecorder()
	r.DebugHandler(runner.DebugConfig{}).ServeHTTP(page, httptest.NewRequest(http.MethodGet, "/", nil))
	if html := page.Body.String(); !strings.Contains(html, `id="not-started"`) || !strings.Contains(html, "unreachable since") {
		t.Fatalf("the debug page while etcd is down does not say it is not started:\n%s", html)
	}
	srv.Restart(t)
	select {
	case <-r.Ready():
	case err := <-done:
		t.Fatalf("Run = %v before it was ready", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not Ready 30s after etcd came up")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n, err := k.inc.Ask(ctx, r, "x", incReq{By: 1}); err != nil || n != 1 {
		t.Fatalf("Ask once ready = %d, %v", n, err)
	}
	if st := r.Status(); st.NotStarted != "" || st.StartError != nil {
		t.Errorf("Status once ready: NotStarted %q, StartError %v; want none", st.NotStarted, st.StartError)
	}
}

// heldClusterReads holds every read of the cluster record — the first
// call a start makes — until release is closed or its context ends, and
// counts the reads that returned.
type heldClusterReads struct {
	*etcd.Store
	release  chan struct{}
	returned atomic.Int64
}

func (h *heldClusterReads) ReadCluster(ctx context.Context) (storage.ClusterInfo, bool, error) {
	defer h.returned.Add(1)
	select {
	case <-h.release:
	case <-ctx.Done():
	}
	return h.Store.ReadCluster(ctx)
}

// TestRefusedConnectionAtStartIsReportedAtOnce: a runner whose etcd
// endpoint refuses connections (a loopback port nothing listens on) logs
// its first WARN, naming the refused connection, and says why in
// Status().NotStarted while its first start call is still waiting for
// its OpTimeout: the report does not wait for that call to fail.
func TestRefusedConnectionAtStartIsReportedAtOnce(t *testing.T) {
	t.Parallel()
	endpoint := testenv.FreeAddr(t)
	s, err := etcd.New(testenv.NewEtcdClient(t, endpoint), "refused-at-start", etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	held := &heldClusterReads{Store: s, release: make(chan struct{})}
	var lc logCapture
	r, err := runner.New(held, runner.Config{ID: "refused", NumShards: 8, OpTimeout: 30 * time.Second, Logger: lc.logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { close(held.release); r.Close(); <-done })
	var warns []logLine
	for held.returned.Load() == 0 {
		if warns = lc.find(slog.LevelWarn, "cannot start"); len(warns) > 0 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	st := r.Status()
	if n := held.returned.Load(); n > 0 || len(warns) == 0 {
		t.Fatalf("the first WARN came after %d start call(s) failed by their OpTimeout (WARN lines: %v); want it while the first still waits", n, warns)
	}
	if !strings.Contains(warns[0].Attrs["err"], "connection refused") || warns[0].Attrs["endpoints"] != endpoint {
		t.Errorf("first WARN = %v, want one naming endpoint %s and the refused connection", warns[0], endpoint)
	}
	want := "not started: etcd at " + endpoint + " unreachable since "
	if !strings.HasPrefix(st.NotStarted, want) || !strings.Contains(st.NotStarted, "connection refused") || !errors.Is(st.StartError, storage.ErrUnavailable) {
		t.Errorf("Status at the first WARN: NotStarted %q, StartError %v; want %q... naming the refused connection", st.NotStarted, st.StartError, want)
	}
}
