package runner_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// probe asks h as a supervisor's probe does and decodes its answer.
func probe(t *testing.T, h http.Handler) (int, runner.HealthCheck) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	var c runner.HealthCheck
	if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil {
		t.Errorf("health answer %d %q: %v", rec.Code, rec.Body, err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("health answer Content-Type %q, want application/json", ct)
	}
	if want := map[bool]int{true: http.StatusOK, false: http.StatusServiceUnavailable}[c.OK]; rec.Code != want {
		t.Errorf("health answer %d with ok=%v, want %d", rec.Code, c.OK, want)
	}
	return rec.Code, c
}

// healthWatch probes a runner's liveness and readiness every 20 ms, as a
// supervisor would, and keeps every answer.
type healthWatch struct {
	mu    sync.Mutex
	live  []runner.HealthCheck
	ready []runner.HealthCheck
	stop  chan struct{}
	done  chan struct{}
}

func watchHealth(t *testing.T, r *runner.Runner) *healthWatch {
	w := &healthWatch{stop: make(chan struct{}), done: make(chan struct{})}
	lh, rh := r.LivenessHandler(), r.ReadinessHandler()
	go func() {
		defer close(w.done)
		for {
			_, l := probe(t, lh)
			_, rd := probe(t, rh)
			w.mu.Lock()
			w.live, w.ready = append(w.live, l), append(w.ready, rd)
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(w.close)
	return w
}

func (w *healthWatch) close() {
	select {
	case <-w.stop:
	default:
		close(w.stop)
	}
	<-w.done
}

// mark returns the number of answers so far: since(mark) returns the later ones.
func (w *healthWatch) mark() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.ready)
}

func (w *healthWatch) since(i int) (live, ready []runner.HealthCheck) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]runner.HealthCheck(nil), w.live[i:]...), append([]runner.HealthCheck(nil), w.ready[i:]...)
}

// waitReady waits until the latest readiness answer after mark satisfies cond.
func (w *healthWatch) waitReady(t *testing.T, mark int, d time.Duration, what string, cond func(runner.HealthCheck) bool) runner.HealthCheck {
	t.Helper()
	var last runner.HealthCheck
	waitFor(t, d, what, func() bool {
		_, ready := w.since(mark)
		if len(ready) == 0 {
			return false
		}
		last = ready[len(ready)-1]
		return cond(last)
	})
	return last
}

// allLive fails t for any liveness answer that was not live.
func allLive(t *testing.T, when string, live []runner.HealthCheck) {
	t.Helper()
	for _, c := range live {
		if !c.OK {
			t.Errorf("%s: liveness answered %+v, want live", when, c)
			return
		}
	}
}

// TestHealthChecksFollowTheDetachRule drives one runner of two, on a real
// etcd behind toxiproxy, through every transition and probes its handlers
// as a supervisor would all along: ready once attached with its shards;
// cut off from etcd (a blackhole), detached and not ready — and live all
// the time, the store's absence never failing liveness; ready again after
// re-attaching; not ready while an operator's drain request stands; not
// ready from the moment Shutdown is called, live until it returned.
func TestHealthChecksFollowTheDetachRule(t *testing.T) {
	t.Parallel()
	pc := testenv.StartProxiedEtcdCluster(t, 1)
	c := newCluster(t, pc.Endpoints(), pc.Client(t))
	cfg := func(id string) runner.Config {
		return runner.Config{ID: id, NumShards: 16, LeaseTTL: 3 * time.Second}
	}
	// During Shutdown, a's hook probes a's handlers as it releases each
	// shard: the answers of a runner midway through its Shutdown.
	var (
		a            *etcdRunner
		shuttingDown atomic.Bool
		duringMu     sync.Mutex
		during       [][2]runner.HealthCheck // liveness, readiness
	)
	ca := cfg("a")
	ca.ReleaseShard = func(context.Context, sharding.ShardID, string) error {
		if shuttingDown.Load() {
			_, l := probe(t, a.LivenessHandler())
			_, rd := probe(t, a.ReadinessHandler())
			duringMu.Lock()
			during = append(during, [2]runner.HealthCheck{l, rd})
			duringMu.Unlock()
		}
		return nil
	}
	a = c.start(ca, pc.ProxiedEndpoints()...)
	b := c.start(cfg("b"))
	w := watchHealth(t, a.Runner)
	ready := func(h runner.HealthCheck) bool { return h.OK }

	h := w.waitReady(t, 0, 30*time.Second, "a ready", ready)
	if h.Phase != "attached" || h.Assigned == 0 || h.AssignedOwned != h.Assigned || !strings.HasPrefix(h.Reason, "attached: owns the") {
		t.Errorf("a ready with %+v, want attached owning every shard assigned to it", h)
	}
	c.waitPartition([]*etcdRunner{a, b}, 16, 30*time.Second)

	// Cut off: a detaches, and is not ready, but live throughout.
	m := w.mark()
	pc.Proxies()[0].Blackhole(t)
	h = w.waitReady(t, m, 30*time.Second, "a not ready, detached", func(h runner.HealthCheck) bool { return !h.OK && h.Phase == "detached" })
	if !strings.HasPrefix(h.Reason, "detached (") || h.Owned != 0 {
		t.Errorf("detached a answers %+v, want the detach's reason and no shard owned", h)
	}
	waitFor(t, 30*time.Second, "b owning every shard", func() bool { return len(b.Owned()) == 16 })
	// a keeps probing the unreachable store: 20 more answers of a detached a.
	detachedAt := w.mark()
	waitFor(t, 30*time.Second, "20 more probes", func() bool { return w.mark() >= detachedAt+20 })
	if _, ready := w.since(detachedAt); ready[0].Phase != "detached" || ready[len(ready)-1].Phase != "detached" {
		t.Errorf("a re-attached while cut off: %+v then %+v", ready[0], ready[len(ready)-1])
	}
	live, _ := w.since(m)
	allLive(t, "cut off from etcd", live)

	// Healed: a re-attaches and takes its share back.
	m = w.mark()
	pc.Proxies()[0].Clear(t)
	h = w.waitReady(t, m, 60*time.Second, "a ready again", ready)
	if h.Phase != "attached" || h.Assigned == 0 {
		t.Errorf("re-attached a answers %+v", h)
	}
	live, _ = w.since(m)
	allLive(t, "re-attaching", live)

	// An operator's drain request: not ready while it stands.
	admin, err := etcd.New(pc.Client(t), c.ns, etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m = w.mark()
	if _, err := admin.RequestDrain(ctx, "a", storage.DrainRequest{Requested: time.Now(), By: "test"}); err != nil {
		t.Fatal(err)
	}
	h = w.waitReady(t, m, 30*time.Second, "a not ready, drained", func(h runner.HealthCheck) bool { return !h.OK })
	if h.Phase != "attached" || !strings.HasPrefix(h.Reason, "drained: ") {
		t.Errorf("drained a answers %+v", h)
	}
	waitFor(t, 30*time.Second, "b owning every shard", func() bool { return len(b.Owned()) == 16 })
	m = w.mark()
	if _, err := admin.CancelDrain(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	h = w.waitReady(t, m, 30*time.Second, "a ready after the drain request was withdrawn", ready)
	if h.Assigned == 0 || h.AssignedOwned != h.Assigned {
		t.Errorf("a ready after its drain with %+v, want its shards back", h)
	}

	// Shutdown: not ready at once, live until the end.
	m = w.mark()
	if h := a.CheckReadiness(); !h.OK {
		t.Fatalf("a not ready before Shutdown: %+v", h)
	}
	shuttingDown.Store(true)
	a.shutdown(t)
	w.close()
	live, readies := w.since(m)
	allLive(t, "shutting down", live)
	for i, h := range readies {
		if h.OK && i > 0 && !readies[i-1].OK {
			t.Errorf("ready again during Shutdown: %+v after %+v", h, readies[i-1])
		}
	}
	duringMu.Lock()
	defer duringMu.Unlock()
	if len(during) == 0 {
		t.Fatal("a released no shard during its Shutdown")
	}
	for _, h := range during {
		if !h[0].OK {
			t.Errorf("liveness during Shutdown = %+v, want live", h[0])
		}
		if h[1].OK || !strings.HasPrefix(h[1].Reason, "stopping: ") {
			t.Errorf("readiness during Shutdown = %+v, want not ready, stopping", h[1])
		}
	}
	if _, h := probe(t, a.ReadinessHandler()); h.OK || h.Phase != "stopped" || h.Reason != "stopped by Shutdown" {
		t.Errorf("readiness after Shutdown = %+v", h)
	}
	if _, h := probe(t, a.LivenessHandler()); !h.OK {
		t.Errorf("liveness after Shutdown = %+v, want live: the process is on its way out, not stuck", h)
	}
}

// TestGatewayReadinessFollowsTheStore: a ClientOnly runner (a gateway),
// on a real etcd behind toxiproxy, is ready once it routes to a hosting
// runner; cut off from etcd (a blackhole: its watch stalls without an
// error), not ready — its view may be stale — but live throughout; ready
// again once the store answers; not ready from the moment Shutdown is
// called.
func TestGatewayReadinessFollowsTheStore(t *testing.T) {
	t.Parallel()
	pc := testenv.StartProxiedEtcdCluster(t, 1)
	c := newCluster(t, pc.Endpoints(), pc.Client(t))
	c.start(runner.Config{ID: "a", NumShards: 8})
	gw := c.start(runner.Config{ID: "gw", NumShards: 8, ClientOnly: true}, pc.ProxiedEndpoints()...)
	w := watchHealth(t, gw.Runner)

	h := w.waitReady(t, 0, 30*time.Second, "the gateway ready", func(h runner.HealthCheck) bool { return h.OK })
	if h.Reason != "routing to 1 runners" {
		t.Errorf("ready gateway answers %+v", h)
	}

	m := w.mark()
	pc.Proxies()[0].Blackhole(t)
	h = w.waitReady(t, m, 30*time.Second, "the cut-off gateway not ready", func(h runner.HealthCheck) bool { return !h.OK })
	if !strings.HasPrefix(h.Reason, "store unreachable for ") {
		t.Errorf("cut-off gateway answers %+v", h)
	}
	m2 := w.mark()
	waitFor(t, 30*time.Second, "20 more probes", func() bool { return w.mark() >= m2+20 })
	pc.Proxies()[0].Clear(t)
	w.waitReady(t, w.mark(), 60*time.Second, "the gateway ready again", func(h runner.HealthCheck) bool { return h.OK })
	live, _ := w.since(m)
	allLive(t, "gateway cut off from etcd", live)

	gw.shutdown(t)
	if _, h := probe(t, gw.ReadinessHandler()); h.OK || h.Reason != "stopped by Shutdown" {
		t.Errorf("gateway readiness after Shutdown = %+v", h)
	}
	if _, h := probe(t, gw.LivenessHandler()); !h.OK {
		t.Errorf("gateway liveness after Shutdown = %+v, want live", h)
	}
}
