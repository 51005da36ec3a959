package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/hostilepeer"
	"github.com/shardhost/shardhost/internal/testenv"
)

// What a hostile peer can make a transport server hold, over real gRPC,
// in plaintext and with mutual TLS (the peer has a certificate of the
// cluster's CA): the bounds doc.go states ("Bounds"), while a legitimate
// client's calls keep being answered within legitLatency.

// legitLatency bounds every call of a legitimate client while hostile
// peers are at work: a correctness bound, generous for a loaded 2-core
// machine.
const legitLatency = 5 * time.Second

// hostileEnv is a transport server echoing deliveries, a legitimate client
// of it, and the TLS configuration of a hostile peer (nil: plaintext).
type hostileEnv struct {
	srv     *GRPC
	addr    string
	legit   *GRPC
	peerTLS *tls.Config
}

func startHostileEnv(t *testing.T, secure bool, h Handler) *hostileEnv {
	t.Helper()
	cfg := GRPCConfig{ListenAddr: "127.0.0.1:0", Logger: quiet()}
	legitCfg := GRPCConfig{Logger: quiet()}
	e := &hostileEnv{}
	if secure {
		pki := testenv.NewPKI(t, "transport")
		cfg.TLS = pki.ServerTLS(pki.MustIssue(t, "runner"))
		legitCfg.PeerTLS = pki.ClientTLS(pki.MustIssue(t, "gateway"))
		e.peerTLS = pki.ClientTLS(pki.MustIssue(t, "hostile"))
	}
	e.srv = NewGRPC(cfg)
	addr, err := e.srv.Listen(h)
	if err != nil {
		t.Fatal(err)
	}
	e.addr = addr
	t.Cleanup(func() { e.srv.Close(0) })
	e.legit = NewGRPC(legitCfg)
	t.Cleanup(func() { e.legit.Close(0) })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 2 * connsPerPeer { // every connection of the legitimate client open
		echo(t, ctx, e.legit, addr, "warm")
	}
	return e
}

func (e *hostileEnv) dial(t *testing.T) *hostilepeer.Peer {
	t.Helper()
	p, err := hostilepeer.Dial(e.addr, e.peerTLS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// open dials the server as a hostile peer and opens a stream of method
// that ends with ctx.
func (e *hostileEnv) open(t *testing.T, ctx context.Context, method string) (*hostilepeer.Peer, *hostilepeer.Conversation) {
	t.Helper()
	p := e.dial(t)
	conv, err := p.Open(ctx, method)
	if err != nil {
		t.Fatal(err)
	}
	return p, conv
}

// asker is a legitimate client calling at once, then every 10 ms until
// check.
type asker struct {
	stopped chan struct{}
	done    chan struct{}
	calls   int
	slowest time.Duration
	errs    []error
}

func (e *hostileEnv) ask() *asker {
	a := &asker{stopped: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(a.done)
		for i := 0; ; i++ {
			if i > 0 {
				select {
				case <-a.stopped:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			start := time.Now()
			text := fmt.Sprint("legit ", i)
			resp, _, err := e.legit.Call(ctx, e.addr, &DeliverRequest{Kind: "k", Method: "m", Entity: "e", Payload: []byte(text)})
			took := time.Since(start)
			cancel()
			a.calls++
			a.slowest = max(a.slowest, took)
			if err == nil && string(resp.Payload) != text {
				err = fmt.Errorf("answer %q, want %q", resp.Payload, text)
			}
			if err != nil && len(a.errs) < 5 {
				a.errs = append(a.errs, err)
			}
		}
	}()
	return a
}

// check stops the asker and checks that its calls succeeded within
// legitLatency.
func (a *asker) check(t *testing.T) {
	t.Helper()
	close(a.stopped)
	<-a.done
	if len(a.errs) > 0 || a.calls == 0 || a.slowest > legitLatency {
		t.Errorf("legitimate calls: %d, slowest %v (bound %v), errors %v", a.calls, a.slowest, legitLatency, a.errs)
	}
	t.Logf("legitimate calls: %d, slowest %v", a.calls, a.slowest)
}

// waitGoroutines waits until the process runs at most n goroutines.
func waitGoroutines(t *testing.T, n int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%s: %d goroutines, want at most %d:\n%s", what, runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func forEachSecurity(t *testing.T, f func(t *testing.T, secure bool)) {
	for _, secure := range []bool{false, true} {
		name := "plaintext"
		if secure {
			name = "mutual TLS"
		}
		t.Run(name, func(t *testing.T) { f(t, secure) })
	}
}

// The bounds of one hostile message's cost (doc.go, "Bounds"): the heap
// grows by at most hostileHeapPerMiB per MiB received, plus
// hostileHeapSlack — what gRPC and the decoder hold of the message while
// it is read (gRPC's buffer, its copy for the codec, the fields kept) —
// and allocates at most hostileAllocPerMiB per MiB, plus the same slack.
const (
	hostileHeapPerMiB  = 8 << 20
	hostileAllocPerMiB = 8 << 20
	hostileHeapSlack   = 8 << 20
)

// TestHostileMessagesCostBoundedHeap: one message of each shape a peer
// can build to make a decoder allocate — a message of empty frames as
// large as the server takes, and one larger, the most frames a batch may
// hold and one more, a request field repeated inside a frame, a string
// repeated inside a request, headers of megabytes — on each RPC that
// decodes it, costs the server at most the bounds above, and no goroutine
// stays behind it. A message over the count or the size limit ends its
// stream with an error.
func TestHostileMessagesCostBoundedHeap(t *testing.T) {
	forEachSecurity(t, func(t *testing.T, secure bool) {
		e := startHostileEnv(t, secure, echoHandler{})
		limit := e.srv.cfg.MaxMessageSize + messageEnvelope // the largest message it takes (doc.go)
		req := hostilepeer.Request("k", "m", "e", []byte("x"))
		for _, c := range []struct {
			name, method string
			msg          []byte
			refused      bool // the stream ends with an error
		}{
			{"empty frames", hostilepeer.Frames, hostilepeer.EmptyFrames(limit), false},
			{"over the size limit", hostilepeer.Frames, hostilepeer.EmptyFrames(limit + 2), true},
			{"most frames", hostilepeer.Frames, hostilepeer.RequestBatch(1, maxRecvBatchFrames, req), false},
			{"tiny frames over the count", hostilepeer.Frames, hostilepeer.TinyFrames(maxRecvBatchFrames + 1), true},
			{"repeated request", hostilepeer.Frames, hostilepeer.Batch(hostilepeer.RepeatedRequest(limit-1<<10, req)), false},
			{"repeated strings", hostilepeer.Frames, hostilepeer.Batch(hostilepeer.Frame(1, hostilepeer.RepeatedStrings(limit-1<<10, req))), false},
			{"giant headers", hostilepeer.Frames, hostilepeer.Batch(hostilepeer.Frame(1, hostilepeer.GiantHeaders(limit-1<<10, req))), false},
			{"legacy repeated request", hostilepeer.Stream, hostilepeer.RepeatedRequest(limit-1<<10, req), false},
			{"legacy giant headers", hostilepeer.Stream, hostilepeer.Frame(1, hostilepeer.GiantHeaders(limit-1<<10, req)), false},
			{"unary repeated strings", hostilepeer.Deliver, hostilepeer.RepeatedStrings(limit-1<<10, req), false},
			{"unary giant headers", hostilepeer.Deliver, hostilepeer.GiantHeaders(limit-1<<10, req), false},
		} {
			t.Run(c.name, func(t *testing.T) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				p, conv := e.open(t, ctx, c.method)
				baseline := runtime.NumGoroutine()
				a := e.ask()
				w := hostilepeer.StartWatch()
				sendErr := conv.Send(c.msg)
				answers, err := conv.Finish()
				peak, alloc := w.Stop()
				a.check(t)
				if sendErr != nil {
					err = sendErr
				}
				if (err != nil) != c.refused {
					t.Errorf("the stream ended with %v (%d answers); refused: %v", err, answers, c.refused)
				}
				mib := float64(len(c.msg)) / (1 << 20)
				t.Logf("%.2f MiB sent: heap grew %.1f MiB (%.1f per MiB), %.1f MiB allocated (%.1f per MiB), %d answers, %v",
					mib, float64(peak)/(1<<20), float64(peak)/(1<<20)/mib, float64(alloc)/(1<<20), float64(alloc)/(1<<20)/mib, answers, err)
				if bound := uint64(mib*hostileHeapPerMiB) + hostileHeapSlack; peak > bound {
					t.Errorf("the heap grew by %d bytes for %d received; bound %d", peak, len(c.msg), bound)
				}
				if bound := uint64(mib*hostileAllocPerMiB) + hostileHeapSlack; alloc > bound {
					t.Errorf("%d bytes allocated for %d received; bound %d", alloc, len(c.msg), bound)
				}
				p.Close()
				waitGoroutines(t, baseline+2, "after the hostile stream ended")
			})
		}
	})
}

// floodUntilHeld sends msg on conv until the server stops reading (no
// send completes for half a second once the server's budget of the
// connection is spent) or n were sent, and returns how many were and the
// most goroutines the process ran meanwhile (sampled).
func (e *hostileEnv) floodUntilHeld(conv *hostilepeer.Conversation, msg []byte, n int) (sent, goroutines int) {
	spent := func() bool {
		held, _ := heldByOne(&e.srv.budgets)
		return held >= maxConnRequests
	}
	sent = conv.FloodUntilHeld(msg, n, 500*time.Millisecond, spent, func() { goroutines = max(goroutines, runtime.NumGoroutine()) })
	return sent, goroutines
}

// heldByAll returns the requests and bytes the delivery streams of every
// connection hold now.
func heldByAll(c *connBudgets) (n, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.m {
		n += b.n.Load()
		bytes += b.bytes.Load()
	}
	return n, bytes
}

// heldByOne returns what the delivery streams of the one connection that
// holds the most requests hold: the bound is per connection, and the
// legitimate client's connection holds its ask in flight beside the
// peer's.
func heldByOne(c *connBudgets) (n, bytes int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range c.m {
		if m := b.n.Load(); m > n {
			n, bytes = m, b.bytes.Load()
		}
	}
	return n, bytes
}

// The bounds a peer that never reads its answers meets: what the
// server's delivery streams hold (maxConnRequests per connection), the
// goroutines that serve them (a worker per request held at most while
// the server works through what it read; then neverReadingGoroutines
// beyond the baseline: the stream's, and its idle workers), and the heap (neverReadingHeap: the answers queued, the requests held
// in the HTTP/2 stream window, gRPC's buffers).
const (
	neverReadingGoroutines = 64
	neverReadingHeap       = 64 << 20
)

// TestNeverReadingPeerIsHeldBack: a peer that sends cheap requests as
// fast as it can and reads no answer is held back — on rpc Frames, on rpc
// Stream (the previous version's), and on unary Deliver — once its
// connection's delivery streams hold maxConnRequests, or its unary calls
// maxStreamsPerConn: it can send no more, the server's goroutines and
// heap stay within the bounds above, and a legitimate client is answered
// meanwhile. Once it goes away, everything it held is given back.
func TestNeverReadingPeerIsHeldBack(t *testing.T) {
	forEachSecurity(t, func(t *testing.T, secure bool) {
		e := startHostileEnv(t, secure, echoHandler{})
		req := hostilepeer.Request("k", "m", "e", []byte("x"))
		for _, c := range []struct {
			method string
			msg    []byte
			perMsg int // requests per message
		}{
			{hostilepeer.Frames, hostilepeer.RequestBatch(1, 64, req), 64},
			{hostilepeer.Stream, hostilepeer.Frame(1, req), 1},
		} {
			t.Run(c.method, func(t *testing.T) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				p, conv := e.open(t, ctx, c.method)
				baseline := runtime.NumGoroutine()
				a := e.ask()
				w := hostilepeer.StartWatch()
				sent, most := e.floodUntilHeld(conv, c.msg, 1<<20/c.perMsg)
				// The server works through what it read until its budget
				// is spent; then its workers go idle.
				waitUntil(t, 30*time.Second, "the connection's budget spent", func() bool {
					n, _ := heldByOne(&e.srv.budgets)
					return n >= maxConnRequests
				})
				waitGoroutines(t, baseline+neverReadingGoroutines, "once the server stopped reading")
				peak, _ := w.Stop()
				held, heldBytes := heldByOne(&e.srv.budgets) // the legitimate client's ask may be in flight on its own
				a.check(t)
				t.Logf("%d requests sent (%.1f MiB) before the peer was held back; the server holds %d (%d bytes); heap grew %.1f MiB; goroutines %d, at most %d, then %d",
					sent*c.perMsg, float64(conv.Sent())/(1<<20), held, heldBytes, float64(peak)/(1<<20), baseline, most, runtime.NumGoroutine())
				if sent*c.perMsg >= 1<<20 {
					t.Errorf("the server read %d requests never answered: not held back", sent*c.perMsg)
				}
				if held > maxConnRequests {
					t.Errorf("the server holds %d requests of the peer, bound %d", held, maxConnRequests)
				}
				if bound := baseline + maxConnRequests + neverReadingGoroutines; most > bound {
					t.Errorf("%d goroutines while the peer sent, %d before: more than %d", most, baseline, bound)
				}
				if peak > neverReadingHeap {
					t.Errorf("the heap grew by %d bytes; bound %d", peak, neverReadingHeap)
				}
				cancel()
				p.Close()
				waitGoroutines(t, baseline+2, "after the peer went away")
				// A stream's end releases what it held once its last
				// worker has returned: wait for it.
				waitUntil(t, 10*time.Second, "the peer's requests released after it went away", func() bool {
					n, b := heldByAll(&e.srv.budgets)
					return n == 0 && b == 0
				})
			})
		}
		t.Run("Deliver", func(t *testing.T) {
			// Unary calls whose answers (100 KiB: over the peer's 64 KiB
			// window) it never reads: each holds its RPC open.
			p := e.dial(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			baseline := runtime.NumGoroutine()
			a := e.ask()
			w := hostilepeer.StartWatch()
			big := hostilepeer.Request("k", "m", "e", make([]byte, 100<<10))
			var opened atomic.Int64
			var opening sync.WaitGroup
			opening.Go(func() {
				for opened.Load() < 4*maxStreamsPerConn { // a call opened beyond the bound waits for a slot
					conv, err := p.Open(ctx, hostilepeer.Deliver)
					if err == nil {
						err = conv.Send(big)
					}
					if err != nil {
						return
					}
					opened.Add(1)
				}
			})
			defer opening.Wait()
			last, since := int64(-1), time.Now()
			for time.Since(since) < 500*time.Millisecond && last < 4*maxStreamsPerConn {
				if n := opened.Load(); n != last {
					last, since = n, time.Now()
				}
				time.Sleep(20 * time.Millisecond)
			}
			peak, _ := w.Stop()
			goroutines := runtime.NumGoroutine()
			a.check(t)
			t.Logf("%d unary calls opened; heap grew %.1f MiB, goroutines %d -> %d", last, float64(peak)/(1<<20), baseline, goroutines)
			if last > maxStreamsPerConn {
				t.Errorf("%d unary calls open at once on one connection, bound %d", last, maxStreamsPerConn)
			}
			if goroutines > baseline+4*maxStreamsPerConn {
				t.Errorf("%d goroutines, %d before", goroutines, baseline)
			}
			if peak > neverReadingHeap {
				t.Errorf("the heap grew by %d bytes; bound %d", peak, neverReadingHeap)
			}
			cancel()
			p.Close()
			waitGoroutines(t, baseline+2, "after the peer went away")
		})
	})
}

// TestManyStreamsFromOnePeer: a peer opening a thousand delivery streams
// on one connection, ignoring the server's SETTINGS (HTTP/2 below gRPC),
// each with a batch of requests, and reading no answer: the server serves
// at most maxStreamsPerConn of them at once and refuses the others, its
// delivery streams hold at most maxConnRequests of the peer's requests,
// with at most 3 goroutines per stream and maxIdleWorkers idle workers,
// and a legitimate client is answered meanwhile.
func TestManyStreamsFromOnePeer(t *testing.T) {
	forEachSecurity(t, func(t *testing.T, secure bool) {
		e := startHostileEnv(t, secure, echoHandler{})
		baseline := runtime.NumGoroutine()
		a := e.ask()
		w := hostilepeer.StartWatch()
		rc, err := hostilepeer.DialRaw(e.addr, e.peerTLS)
		if err != nil {
			t.Fatal(err)
		}
		const streams = 1000
		msg := hostilepeer.RequestBatch(1, 256, hostilepeer.Request("k", "m", "e", []byte("x")))
		for i := range streams {
			if err := rc.Open(hostilepeer.Frames, msg); err != nil {
				t.Fatalf("stream %d: %v", i, err)
			}
		}
		waitUntil(t, 10*time.Second, "the streams beyond the limit refused", func() bool { return rc.Refused() >= streams-maxStreamsPerConn })
		time.Sleep(200 * time.Millisecond)
		peak, _ := w.Stop()
		held, _ := heldByOne(&e.srv.budgets)
		var users int
		e.srv.budgets.mu.Lock()
		for _, b := range e.srv.budgets.m {
			users = max(users, b.users)
		}
		e.srv.budgets.mu.Unlock()
		goroutines := runtime.NumGoroutine()
		a.check(t)
		t.Logf("%d streams opened, %d refused, %d served at once; %d requests held; heap grew %.1f MiB; goroutines %d -> %d",
			streams, rc.Refused(), users, held, float64(peak)/(1<<20), baseline, goroutines)
		if users > maxStreamsPerConn {
			t.Errorf("%d delivery streams served at once on one connection, bound %d", users, maxStreamsPerConn)
		}
		if held > maxConnRequests+maxStreamsPerConn {
			t.Errorf("%d requests held for one connection, bound %d", held, maxConnRequests+maxStreamsPerConn)
		}
		if bound := baseline + maxStreamsPerConn*(3+maxIdleWorkers) + neverReadingGoroutines; goroutines > bound {
			t.Errorf("%d goroutines, %d before: more than %d", goroutines, baseline, bound)
		}
		if peak > neverReadingHeap {
			t.Errorf("the heap grew by %d bytes; bound %d", peak, neverReadingHeap)
		}
		rc.Close()
		waitGoroutines(t, baseline+2, "after the peer went away")
	})
}

// writtenHandler echoes, and counts the written callbacks called.
type writtenHandler struct{ written atomic.Int64 }

func (h *writtenHandler) Deliver(_ context.Context, req *DeliverRequest) (*DeliverResponse, func()) {
	return &DeliverResponse{Payload: req.Payload}, func() { h.written.Add(1) }
}

func (*writtenHandler) Hot(uint32, int) []EntityRef { return nil }

// TestNeverReadingPeerDoesNotHoldWrittenCallbacks: the answers a peer
// does not read (more than its HTTP/2 window, so they cannot all be
// sent) are given up within stallAfter and a half — their written
// callbacks called: a runner's drain of the shards they come from does
// not wait for that peer — on rpc Frames and rpc Stream.
func TestNeverReadingPeerDoesNotHoldWrittenCallbacks(t *testing.T) {
	for _, method := range []string{hostilepeer.Frames, hostilepeer.Stream} {
		t.Run(method, func(t *testing.T) {
			h := &writtenHandler{}
			e := startHostileEnv(t, false, h)
			warm := h.written.Load()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			_, conv := e.open(t, ctx, method)
			const n = 20
			req := hostilepeer.Request("k", "m", "e", make([]byte, 60<<10)) // n answers: far over the 64 KiB window
			start := time.Now()
			for i := range n {
				msg := hostilepeer.Frame(uint64(i+1), req)
				if method == hostilepeer.Frames {
					msg = hostilepeer.Batch(msg)
				}
				if err := conv.Send(msg); err != nil {
					t.Fatal(err)
				}
			}
			waitUntil(t, 10*time.Second, "every written callback", func() bool { return h.written.Load()-warm == n })
			took := time.Since(start)
			t.Logf("%d answers not read: written callbacks all called after %v", n, took)
			if took > stallAfter*3/2+legitLatency {
				t.Errorf("written callbacks called after %v; want within %v", took, stallAfter*3/2)
			}
		})
	}
}

// bigHoldHandler echoes, but holds every request larger than
// maxStreamPayload (a unary call) until release is closed.
type bigHoldHandler struct {
	release chan struct{}
	held    *atomic.Int64
}

func (h bigHoldHandler) Deliver(_ context.Context, req *DeliverRequest) (*DeliverResponse, func()) {
	if len(req.Payload) > maxStreamPayload {
		h.held.Add(1)
		<-h.release
		return &DeliverResponse{}, func() {}
	}
	return &DeliverResponse{Payload: req.Payload}, func() {}
}

func (bigHoldHandler) Hot(uint32, int) []EntityRef { return nil }

// TestDeliveryStreamWaitsForASlotAtMostConnectTimeout: with every RPC slot
// of its connections taken by unary calls (large requests held by the
// server), a call that needs a new delivery stream waits at most
// ConnectTimeout for a slot and is told it was not sent; once slots free
// up, calls go through.
func TestDeliveryStreamWaitsForASlotAtMostConnectTimeout(t *testing.T) {
	h := bigHoldHandler{release: make(chan struct{}), held: new(atomic.Int64)}
	srv := NewGRPC(GRPCConfig{ListenAddr: "127.0.0.1:0", Logger: quiet()})
	addr, err := srv.Listen(h)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close(0)
	const connect = 300 * time.Millisecond
	c := NewGRPC(GRPCConfig{Logger: quiet(), ConnectTimeout: connect})
	defer c.Close(0)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range connsPerPeer { // both connections ready (Hot: unary, no delivery stream)
		if _, err := c.Hot(ctx, addr, 0, 1); err != nil {
			t.Fatal(err)
		}
	}
	var held sync.WaitGroup
	for range connsPerPeer * maxStreamsPerConn {
		held.Go(func() {
			_, _, _ = c.Call(ctx, addr, &DeliverRequest{Kind: "k", Method: "m", Entity: "e", Payload: make([]byte, maxStreamPayload+1)})
		})
	}
	waitUntil(t, 30*time.Second, "every slot taken", func() bool { return h.held.Load() == connsPerPeer*maxStreamsPerConn })
	start := time.Now()
	_, sent, err := c.Call(ctx, addr, &DeliverRequest{Kind: "k", Method: "m", Entity: "e", Payload: []byte("small")})
	took := time.Since(start)
	if sent || !errors.Is(err, ErrNotSent) || took > connect+legitLatency {
		t.Errorf("a call needing a delivery stream with no slot free = sent %v, %v after %v; want not sent within ConnectTimeout (%v)", sent, err, took, connect)
	}
	close(h.release)
	held.Wait()
	echo(t, ctx, c, addr, "after")
}
