package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoHandler answers every delivery with its own payload.
type echoHandler struct{}

func (echoHandler) Deliver(_ context.Context, req *DeliverRequest) (*DeliverResponse, func()) {
	return &DeliverResponse{Payload: req.Payload}, func() {}
}

func (echoHandler) Hot(uint32, int) []EntityRef { return nil }

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// startServer runs a gRPC transport serving echoHandler on a free loopback
// port, after tweak (before Listen).
func startServer(t *testing.T, cfg GRPCConfig, tweak func(*GRPC)) (*GRPC, string) {
	t.Helper()
	cfg.ListenAddr, cfg.Logger = "127.0.0.1:0", quiet()
	g := NewGRPC(cfg)
	if tweak != nil {
		tweak(g)
	}
	addr, err := g.Listen(echoHandler{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close(0) })
	return g, addr
}

// startClient returns a gRPC transport that serves nothing.
func startClient(t *testing.T) *GRPC {
	t.Helper()
	g := NewGRPC(GRPCConfig{Logger: quiet()})
	if addr, err := g.Listen(echoHandler{}); err != nil || addr != "" {
		t.Fatalf("Listen without ListenAddr = %q, %v", addr, err)
	}
	t.Cleanup(func() { g.Close(0) })
	return g
}

// echo calls the echo server at addr through c and checks the answer.
func echo(t *testing.T, ctx context.Context, c Transport, addr, text string) {
	t.Helper()
	resp, sent, err := c.Call(ctx, addr, &DeliverRequest{Kind: "k", Method: "m", Entity: "e", Payload: []byte(text)})
	if err != nil || !sent || string(resp.Payload) != text {
		t.Fatalf("Call(%q) = %v, sent %v, %v", text, resp, sent, err)
	}
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

// A thousand connections that never send the HTTP/2 preface are closed by
// the server after the handshake deadline, and the goroutines serving them
// return: the goroutine count comes back to where it was. The server
// answers throughout.
func TestIdleConnectionsAreClosed(t *testing.T) {
	a, addr := startServer(t, GRPCConfig{}, func(g *GRPC) { g.handshakeTimeout = 500 * time.Millisecond })
	gw := startClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 2 * connsPerPeer { // every connection to a in use
		echo(t, ctx, gw, addr, "x")
	}
	baseline := runtime.NumGoroutine()

	ic := openIdle(t, addr, 1000)
	waitUntil(t, 30*time.Second, "the server to close all 1000 idle connections", func() bool { return ic.closed.Load() == 1000 })
	echo(t, ctx, gw, addr, "still")
	ic.wg.Wait() // our reader goroutines are done
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > baseline+5 || a.limit.Open() > connsPerPeer {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			t.Fatalf("goroutines %d (baseline %d), connections held %d:\n%s", runtime.NumGoroutine(), baseline, a.limit.Open(), buf[:min(n, 20000)])
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("goroutines: %d before, %d after 1000 idle connections were closed", baseline, runtime.NumGoroutine())
}

// Beyond MaxConnections, new connections are closed as soon as they are
// accepted; the server never holds more. When slots free up, peers connect
// again.
func TestConnectionsBeyondMaxAreRefused(t *testing.T) {
	const limit = 50
	a, addr := startServer(t, GRPCConfig{MaxConnections: limit}, func(g *GRPC) {
		g.handshakeTimeout = time.Minute // held until closed by us
	})

	ic := openIdle(t, addr, 4*limit)
	waitUntil(t, 10*time.Second, "the connections beyond the limit refused", func() bool { return ic.closed.Load() >= 3*limit })
	if open := a.limit.Open(); open > limit {
		t.Fatalf("the server holds %d connections, limit %d", open, limit)
	}
	if got := ic.closed.Load(); got != 3*limit {
		t.Errorf("%d connections closed by the server, want %d (those beyond the limit)", got, 3*limit)
	}
	if got := a.refused.Load(); got < 3*limit {
		t.Errorf("refused counter %d, want >= %d", got, 3*limit)
	}
	ic.close()
	waitUntil(t, 10*time.Second, "slots freed", func() bool { return a.limit.Open() == 0 })
	gw := startClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	echo(t, ctx, gw, addr, "in")
}

// A runner of the previous version serves rpc Stream but not rpc Frames:
// the first call to it learns that and is told it was not sent (nothing
// was delivered), and every later call reaches it over rpc Stream.
func TestCallsReachRunnerOfPreviousVersion(t *testing.T) {
	h := &deadlineHandler{}
	prev := NewGRPC(GRPCConfig{Logger: quiet()})
	prev.h = h
	desc := serviceDesc
	desc.Streams = slices.DeleteFunc(slices.Clone(desc.Streams), func(d grpc.StreamDesc) bool { return d.StreamName == "Frames" })
	srv := grpc.NewServer(grpc.ForceServerCodecV2(wireCodec{}))
	srv.RegisterService(&desc, grpcService(prev))
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var serving sync.WaitGroup
	serving.Go(func() { _ = srv.Serve(lis) })
	t.Cleanup(func() { srv.Stop(); serving.Wait() })
	addr := lis.Addr().String()

	c := startClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := &DeliverRequest{Kind: "k", Method: "m", Entity: "e", Payload: []byte("first")}
	if resp, sent, err := c.Call(ctx, addr, req); sent || !errors.Is(err, ErrNotSent) {
		t.Fatalf("first Call = %v, sent %v, %v; want not sent", resp, sent, err)
	}
	if n := h.written.Load(); n != 0 {
		t.Fatalf("%d deliveries after the refused stream, want 0", n)
	}
	for i := range 10 {
		echo(t, ctx, c, addr, strconv.Itoa(i))
	}
	if n := h.written.Load(); n != 10 {
		t.Fatalf("%d deliveries, want 10", n)
	}
}

// Frames sent together never make a stream message over the size limit:
// concurrent calls whose requests and answers each fit MaxMessageSize, but
// not together, all succeed (a batch over the limit would fail the send
// and the stream).
func TestConcurrentLargeMessagesStayWithinSizeLimit(t *testing.T) {
	const limit = 100 << 10
	_, addr := startServer(t, GRPCConfig{MaxMessageSize: limit}, nil)
	c := NewGRPC(GRPCConfig{Logger: quiet(), MaxMessageSize: limit})
	t.Cleanup(func() { c.Close(0) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	echo(t, ctx, c, addr, "warm")
	payload := strings.Repeat("x", 60<<10) // one fits, two do not
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Go(func() {
			text := strconv.Itoa(i) + payload
			resp, sent, err := c.Call(ctx, addr, &DeliverRequest{Kind: "k", Method: "m", Entity: "e", Payload: []byte(text)})
			if err != nil || !sent || string(resp.Payload) != text {
				t.Errorf("Call %d = sent %v, %v", i, sent, err)
			}
		})
	}
	wg.Wait()
}

// A runner of the previous version calls over rpc Stream (a frame per
// message): this one still answers it.
func TestRunnerOfPreviousVersionIsAnswered(t *testing.T) {
	_, addr := startServer(t, GRPCConfig{}, nil)
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(wireCodec{})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	ms, err := newMuxStream(cc, true, 0, 0) // rpc Stream, as the previous version's client
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ms.cancel)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			text := strconv.Itoa(i)
			resp, err, sent := ms.call(ctx, &DeliverRequest{Kind: "k", Method: "m", Entity: "e", Payload: []byte(text)}, time.Minute)
			if err != nil || !sent || string(resp.Payload) != text {
				t.Errorf("call %d = %v, sent %v, %v", i, resp, sent, err)
			}
		})
	}
	wg.Wait()
}

// gateHandler echoes, but holds a request whose payload is "hold" until
// release is closed.
type gateHandler struct{ release chan struct{} }

func (h gateHandler) Deliver(_ context.Context, req *DeliverRequest) (*DeliverResponse, func()) {
	if string(req.Payload) == "hold" {
		<-h.release
	}
	return &DeliverResponse{Payload: req.Payload}, func() {}
}

func (gateHandler) Hot(uint32, int) []EntityRef { return nil }

// TestCallsWithoutDeadlineEndAtRequestTimeout: a call whose context has
// no deadline ends at RequestTimeout (maybe delivered), never sooner —
// also after calls before it on the same stream were answered or timed
// out — and the calls after it are answered.
func TestCallsWithoutDeadlineEndAtRequestTimeout(t *testing.T) {
	const timeout = 100 * time.Millisecond
	h := gateHandler{release: make(chan struct{})}
	srv := NewGRPC(GRPCConfig{ListenAddr: "127.0.0.1:0", Logger: quiet()})
	addr, err := srv.Listen(h)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(0)
	defer close(h.release) // before Close: the held handlers return
	c := NewGRPC(GRPCConfig{Logger: quiet(), RequestTimeout: timeout})
	defer c.Close(0)
	ctx := context.Background()
	held := func() {
		t.Helper()
		start := time.Now()
		_, sent, err := c.Call(ctx, addr, &DeliverRequest{Kind: "k", Method: "m", Entity: "e", Payload: []byte("hold")})
		if took := time.Since(start); !sent || !errors.Is(err, ErrMaybeDelivered) || !errors.Is(err, context.DeadlineExceeded) || took < timeout {
			t.Fatalf("held call = sent %v, %v after %v; want maybe delivered, deadline exceeded, after %v or more", sent, err, took, timeout)
		}
	}
	echo(t, ctx, c, addr, "warm")
	held()
	for i := range 50 {
		echo(t, ctx, c, addr, fmt.Sprint("after a timeout ", i))
	}
	held()
	held()
	echo(t, ctx, c, addr, "last")
}
