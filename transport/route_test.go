package transport

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
)

// testRoute is a Route a test moves: Current until moved.
type testRoute struct {
	mu      sync.Mutex
	changed chan struct{}
	moved   atomic.Bool
	checks  atomic.Int64 // Current calls
}

func newTestRoute() *testRoute { return &testRoute{changed: make(chan struct{})} }

func (r *testRoute) Changed() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.changed
}

func (r *testRoute) Current() bool { r.checks.Add(1); return !r.moved.Load() }

// change signals a routing change; moved says whether it moved this route.
func (r *testRoute) change(moved bool) {
	r.moved.Store(moved)
	r.mu.Lock()
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// TestCallRouteStopsConnectingWhenRouteChanges: a call waiting for a
// connection to a black-holed peer (ConnectTimeout 1 min) keeps waiting
// through routing changes that leave its route current, and gives up —
// nothing sent, ErrNotSent and ErrRouteChanged — at the change that moves
// it, while the hanging dial is still open (before gRPC's own connect
// timeout closes it).
func TestCallRouteStopsConnectingWhenRouteChanges(t *testing.T) {
	bh := testenv.StartBlackhole(t)
	cli := NewGRPC(GRPCConfig{Logger: quiet(), ConnectTimeout: time.Minute})
	t.Cleanup(func() { cli.Close(0) })
	route := newTestRoute()
	type result struct {
		sent bool
		err  error
	}
	res := make(chan result, 1)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	go func() {
		_, sent, err := cli.CallRoute(ctx, bh.Addr(), &DeliverRequest{Payload: []byte("x")}, route)
		res <- result{sent, err}
	}()
	<-bh.Accepted() // the dial hangs
	for route.checks.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	route.change(false) // another shard's route: keep waiting
	for route.checks.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	select {
	case r := <-res:
		t.Fatalf("the call ended at a change that left its route current: sent %v, %v", r.sent, r.err)
	default:
	}
	route.change(true)
	r := <-res
	if r.sent || !errors.Is(r.err, ErrNotSent) || !errors.Is(r.err, ErrRouteChanged) {
		t.Fatalf("CallRoute after its route moved = sent %v, %v; want not sent, ErrNotSent and ErrRouteChanged", r.sent, r.err)
	}
	select {
	case <-bh.Closed():
		t.Fatal("the call gave up only once the dial ended, not when its route moved")
	default:
	}
}

// TestCallRouteNotCurrentGivesUpAtOnce: a route already moved when the
// call would wait for a connection ends it without waiting; a nil route is
// Call (waits for the connection).
func TestCallRouteNotCurrentGivesUpAtOnce(t *testing.T) {
	bh := testenv.StartBlackhole(t)
	g := NewGRPC(GRPCConfig{Logger: quiet(), ConnectTimeout: time.Minute})
	t.Cleanup(func() { g.Close(0) })
	route := newTestRoute()
	route.moved.Store(true)
	_, sent, err := g.CallRoute(t.Context(), bh.Addr(), &DeliverRequest{}, route)
	if sent || !errors.Is(err, ErrRouteChanged) {
		t.Fatalf("CallRoute with a moved route = sent %v, %v; want ErrRouteChanged", sent, err)
	}

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, sent, err = g.CallRoute(ctx, bh.Addr(), &DeliverRequest{}, nil)
	if sent || !errors.Is(err, ErrNotSent) || errors.Is(err, ErrRouteChanged) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("CallRoute with no route to a black hole = sent %v, %v; want ErrNotSent at the context's deadline", sent, err)
	}
}

// TestInmemCallRouteStopsConnectingWhenRouteChanges: the in-memory
// transport gives way the same: a call across a cut (ConnectTimeout 1 min)
// ends, nothing delivered, with ErrNotSent and ErrRouteChanged at the
// change that moves its route — before ConnectTimeout, in virtual time.
func TestInmemCallRouteStopsConnectingWhenRouteChanges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := NewInmemNetwork()
		n.ConnectTimeout = time.Minute
		h := &countingHandler{}
		srv, cli := n.Transport("a"), n.Transport("c")
		if _, err := srv.Listen(h); err != nil {
			t.Fatal(err)
		}
		defer srv.Close(0)
		defer cli.Close(0)
		n.Cut("c", "a", true)
		route := newTestRoute()
		start := time.Now()
		time.AfterFunc(time.Second, func() { route.change(false) })
		time.AfterFunc(2*time.Second, func() { route.change(true) })
		_, sent, err := cli.CallRoute(t.Context(), "a", &DeliverRequest{Payload: []byte("x")}, route)
		if sent || !errors.Is(err, ErrNotSent) || !errors.Is(err, ErrRouteChanged) {
			t.Fatalf("CallRoute across a cut after its route moved = sent %v, %v; want ErrNotSent and ErrRouteChanged", sent, err)
		}
		if waited := time.Since(start); waited != 2*time.Second {
			t.Errorf("gave up after %v, want at the moving change (2s), not the first change (1s) or ConnectTimeout", waited)
		}
		if h.ran.Load() != 0 {
			t.Error("a call whose route moved was delivered")
		}
	})
}
