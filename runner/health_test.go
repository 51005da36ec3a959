package runner_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// TestReadinessOfAClientOnlyRunner: a ClientOnly runner (a gateway) is
// live but not ready before Run and while no hosting runner is
// registered; ready once one is, routing; not ready once Shutdown is
// called, and still live after it.
func TestReadinessOfAClientOnlyRunner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		gw, err := runner.New(c.NewStore("gw"), runner.Config{ID: "gw", NumShards: 8, ClientOnly: true, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if h := gw.CheckReadiness(); h.OK || h.Phase != "new" {
			t.Errorf("readiness before Run = %+v, want not ready, new", h)
		}
		if h := gw.CheckLiveness(); !h.OK {
			t.Errorf("liveness before Run = %+v, want live", h)
		}
		runAsync(t, gw)
		time.Sleep(5 * time.Second)
		if h := gw.CheckReadiness(); h.OK {
			t.Errorf("readiness with no hosting runner = %+v, want not ready", h)
		}
		start(t, c, nil, runner.Config{ID: "a", NumShards: 8})
		waitFor(t, 10*time.Second, "the gateway ready", func() bool { return gw.CheckReadiness().OK })
		if h := gw.CheckReadiness(); h.Reason != "routing to 1 runners" {
			t.Errorf("ready gateway says %q", h.Reason)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		if err := gw.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		if h := gw.CheckReadiness(); h.OK || h.Reason != "stopped by Shutdown" {
			t.Errorf("readiness after Shutdown = %+v", h)
		}
		if h := gw.CheckLiveness(); !h.OK {
			t.Errorf("liveness after Shutdown = %+v, want live", h)
		}
	})
}

// TestGatewayNotReadyWhileItsMembershipViewIsStale: a ready ClientOnly
// runner is not ready while it cannot tell whether its membership view is
// current — its probes of the store fail (cut off: its watch would stall
// without an error), or its runners' watch failed and no listing
// succeeded since — and ready again once both work; live throughout.
func TestGatewayNotReadyWhileItsMembershipViewIsStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		start(t, c, nil, runner.Config{ID: "a", NumShards: 8})
		s := c.NewStore("gw")
		gw, err := runner.New(s, runner.Config{ID: "gw", NumShards: 8, ClientOnly: true, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		runAsync(t, gw)
		waitFor(t, 10*time.Second, "the gateway ready", func() bool { return gw.CheckReadiness().OK })

		s.Partition(true)
		waitFor(t, 10*time.Second, "the cut-off gateway not ready", func() bool { return !gw.CheckReadiness().OK })
		if h := gw.CheckReadiness(); !strings.HasPrefix(h.Reason, "store unreachable for ") {
			t.Errorf("cut-off gateway answers %+v", h)
		}
		if h := gw.CheckLiveness(); !h.OK {
			t.Errorf("liveness of the cut-off gateway = %+v, want live", h)
		}
		s.Partition(false)
		waitFor(t, 10*time.Second, "the gateway ready again", func() bool { return gw.CheckReadiness().OK })

		s.Fail(memory.OpList, storage.ErrUnavailable)
		s.BreakWatches()
		waitFor(t, 10*time.Second, "the gateway not ready, its watch broken", func() bool { return !gw.CheckReadiness().OK })
		if h := gw.CheckReadiness(); !strings.HasPrefix(h.Reason, "membership view not current: ") {
			t.Errorf("gateway with a broken watch answers %+v", h)
		}
		if h := gw.CheckLiveness(); !h.OK {
			t.Errorf("liveness of the gateway with a broken watch = %+v, want live", h)
		}
		s.Fail(memory.OpList, nil)
		waitFor(t, 10*time.Second, "the gateway ready after a listing", func() bool { return gw.CheckReadiness().OK })
	})
}

// TestLivenessEndsWithRun: a runner whose Run failed (here: configured
// otherwise than its cluster) is not live, its answer quoting the error;
// nor is one whose Run ended by Close. Neither is ready.
func TestLivenessEndsWithRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		start(t, c, nil, runner.Config{ID: "a", NumShards: 8})
		time.Sleep(time.Second)
		b, err := runner.New(c.NewStore("b"), runner.Config{ID: "b", NumShards: 16, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := runErr(t, runAsync(t, b), time.Minute); !errors.Is(err, runner.ErrClusterMismatch) {
			t.Fatalf("Run = %v, want ErrClusterMismatch", err)
		}
		if h := b.CheckLiveness(); h.OK || !strings.Contains(h.Reason, "stopped: ") || !strings.Contains(h.Reason, "NumShards") {
			t.Errorf("liveness after a failed Run = %+v, want not live, quoting the error", h)
		}
		if h := b.CheckReadiness(); h.OK {
			t.Errorf("readiness after a failed Run = %+v", h)
		}

		d := start(t, c, nil, runner.Config{ID: "d", NumShards: 8})
		waitFor(t, 10*time.Second, "d ready", func() bool { return d.CheckReadiness().OK })
		d.Close()
		if h := d.CheckLiveness(); h.OK || h.Phase != "stopped" {
			t.Errorf("liveness after Close = %+v, want not live", h)
		}
	})
}

// TestHealthHandlersAnswerGetAndHead: GET answers the JSON body, HEAD the
// same status without it, other methods 405 with Allow.
func TestHealthHandlersAnswerGetAndHead(t *testing.T) {
	s := memory.New()
	defer s.Cluster().Close()
	r, err := runner.New(s, runner.Config{ID: "a", NumShards: 4})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		h    http.Handler
		code int // before Run: live, not ready
	}{
		{"liveness", r.LivenessHandler(), http.StatusOK},
		{"readiness", r.ReadinessHandler(), http.StatusServiceUnavailable},
	} {
		if code, h := probe(t, tc.h); code != tc.code || h.Runner != "a" || h.Phase != "new" || h.Reason != "not started: Run not called" {
			t.Errorf("%s GET = %d %+v, want %d", tc.name, code, h, tc.code)
		}
		rec := httptest.NewRecorder()
		tc.h.ServeHTTP(rec, httptest.NewRequest(http.MethodHead, "/", nil))
		if rec.Code != tc.code || rec.Body.Len() != 0 {
			t.Errorf("%s HEAD = %d with %d bytes, want %d and no body", tc.name, rec.Code, rec.Body.Len(), tc.code)
		}
		rec = httptest.NewRecorder()
		tc.h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
			t.Errorf("%s POST = %d (Allow %q), want 405", tc.name, rec.Code, rec.Header().Get("Allow"))
		}
	}
}
