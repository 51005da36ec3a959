package runner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
)

// startTweaked runs a runner on c after tweak (called before Run) and
// waits until Run has started.
func startTweaked(t *testing.T, c *memory.Cluster, cfg Config, tweak func(*Runner)) *Runner {
	t.Helper()
	cfg.NumShards = 16
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := New(c.NewStore(cfg.ID), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(echoKind); err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(r)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(context.Background()) }()
	t.Cleanup(func() { r.Close(); <-done })
	for r.Status().Phase == "new" {
		time.Sleep(time.Millisecond)
	}
	return r
}

// idleConns opens n TCP connections to addr that never send a byte and
// counts those the server closes.
type idleConns struct {
	conns  []net.Conn
	closed atomic.Int64
	wg     sync.WaitGroup
}

func openIdle(t *testing.T, addr string, n int) *idleConns {
	t.Helper()
	ic := &idleConns{}
	for range n {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatalf("dial %d: %v", len(ic.conns), err)
		}
		ic.conns = append(ic.conns, c)
		ic.wg.Go(func() {
			buf := make([]byte, 64)
			for {
				if _, err := c.Read(buf); err != nil { // closed by the server (or by close below)
					ic.closed.Add(1)
					return
				}
			}
		})
	}
	t.Cleanup(ic.close)
	return ic
}

func (ic *idleConns) close() {
	for _, c := range ic.conns {
		_ = c.Close()
	}
	ic.wg.Wait()
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A thousand connections that never send the HTTP/2 preface are closed by
// the server after the handshake deadline, and the goroutines serving them
// return: the runner's goroutine count comes back to where it was. The
// runner serves throughout.
func TestIdleConnectionsAreClosed(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	a := startTweaked(t, c, Config{ID: "a", ListenAddr: "127.0.0.1:0"}, func(r *Runner) {
		r.transport.handshakeTimeout = 500 * time.Millisecond
	})
	gw := startTweaked(t, c, Config{ID: "gw", ClientOnly: true}, nil)
	waitUntil(t, 10*time.Second, "a owns all shards", func() bool { return len(a.Owned()) == 16 })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 2 * connsPerPeer { // every connection to a in use
		if _, err := echoMethod.Ask(ctx, gw, "k", echoReq{Text: "x"}); err != nil {
			t.Fatal(err)
		}
	}
	baseline := runtime.NumGoroutine()

	ic := openIdle(t, a.Address(), 1000)
	waitUntil(t, 30*time.Second, "the server to close all 1000 idle connections", func() bool { return ic.closed.Load() == 1000 })
	if got, err := echoMethod.Ask(ctx, gw, "k", echoReq{Text: "still"}); err != nil || got.Text != "still" {
		t.Fatalf("Ask after the idle connections = %+v, %v", got, err)
	}
	ic.wg.Wait() // our reader goroutines are done
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > baseline+5 || a.transport.limit.Open() > connsPerPeer {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("goroutines %d (baseline %d), connections held %d:\n%s", runtime.NumGoroutine(), baseline, a.transport.limit.Open(), buf[:min(n, 20000)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("goroutines: %d before, %d after 1000 idle connections were closed", baseline, runtime.NumGoroutine())
}

// Beyond MaxConnections, new connections are closed as soon as they are
// accepted; the server never holds more. When slots free up, peers connect
// again.
func TestConnectionsBeyondMaxAreRefused(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	const limit = 50
	a := startTweaked(t, c, Config{ID: "a", ListenAddr: "127.0.0.1:0", MaxConnections: limit}, func(r *Runner) {
		r.transport.handshakeTimeout = time.Minute // held until closed by us
	})
	waitUntil(t, 10*time.Second, "a owns all shards", func() bool { return len(a.Owned()) == 16 })

	ic := openIdle(t, a.Address(), 4*limit)
	waitUntil(t, 10*time.Second, "the connections beyond the limit refused", func() bool { return ic.closed.Load() >= 3*limit })
	if open := a.transport.limit.Open(); open > limit {
		t.Fatalf("the server holds %d connections, limit %d", open, limit)
	}
	if got := ic.closed.Load(); got != 3*limit {
		t.Errorf("%d connections closed by the server, want %d (those beyond the limit)", got, 3*limit)
	}
	if got := a.transport.refused.Load(); got < 3*limit {
		t.Errorf("refused counter %d, want >= %d", got, 3*limit)
	}
	ic.close()
	waitUntil(t, 10*time.Second, "slots freed", func() bool { return a.transport.limit.Open() == 0 })
	gw := startTweaked(t, c, Config{ID: "gw", ClientOnly: true}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if got, err := echoMethod.Ask(ctx, gw, "k", echoReq{Text: "in"}); err != nil || got.Text != "in" {
		t.Fatalf("Ask once slots are free = %+v, %v", got, err)
	}
}

// The receiving side checks the context first too: a delivery whose
// context ended (in transit, or the stream broke) is answered UNDELIVERED
// and no entity is even created.
func TestDeliverHereRefusesEndedContext(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	a := startTweaked(t, c, Config{ID: "a", ListenAddr: "127.0.0.1:0"}, nil)
	waitUntil(t, 10*time.Second, "a owns all shards", func() bool { return len(a.Owned()) == 16 })
	payload, _ := entity.JSON.Marshal(echoReq{Text: "x"})
	req := &deliverRequest{Kind: "echo", Method: "echo", Entity: "k", Shard: uint32(sharding.ShardOf("k", 16)), Payload: payload, Codec: entity.JSON.Name()}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	resp, written := a.transport.deliverHere(ctx, req)
	written()
	if resp.Code != codeUndelivered {
		t.Fatalf("deliverHere(ended context) = %v %q, want UNDELIVERED", resp.Code, resp.Message)
	}
	if err, retry := responseError("a", req, resp); !retry || err == nil {
		t.Errorf("the sender reads %v (retry %v), want a not-delivered error", err, retry)
	}
	if n := a.EntityCount(); n != 0 {
		t.Errorf("%d entities created for a delivery whose context had ended", n)
	}
	resp, written = a.transport.deliverHere(context.Background(), req)
	written()
	if resp.Code != codeOK {
		t.Fatalf("deliverHere = %v %q", resp.Code, resp.Message)
	}
	// The host refuses it too (the local path, after Send's own check).
	sh := a.hosts[sharding.ShardOf("k", 16)].Load()
	k := a.kind("echo")
	h, _ := k.desc.Handler("echo")
	var ud *UndeliveredError
	if res := sh.deliver(ctx, k, h, "k", echoReq{}, false, false); !res.undelivered || !errors.As(res.err, &ud) || !errors.Is(res.err, context.Canceled) {
		t.Errorf("deliver(ended context) = %v (undelivered %v), want a not-sent *UndeliveredError matching context.Canceled", res.err, res.undelivered)
	}
}
