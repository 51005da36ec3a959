package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
)

// The multiplexed delivery stream (transport.proto, rpc Stream). A unary
// RPC per message costs a new HTTP/2 stream, headers and trailers both
// ways; one long-lived stream per connection carries only the messages.

const streamMethod = "/shardhost.v1.Runner/Stream"

var streamDesc = grpc.StreamDesc{StreamName: "Stream", ServerStreams: true, ClientStreams: true}

// --- server side ---

// serveStream answers the frames of one client stream, each on its own
// goroutine, until the client closes its side. When the transport stops
// gracefully it sends a goaway frame and keeps answering what arrives
// until the client, having received every answer, closes its side.
func (t *transport) serveStream(ss grpc.ServerStream) error {
	var (
		sendMu sync.Mutex
		wg     sync.WaitGroup
	)
	send := func(f *frame) {
		sendMu.Lock()
		defer sendMu.Unlock()
		_ = ss.SendMsg(f) // an error ends the stream; RecvMsg reports it
	}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-t.goaway:
			send(&frame{GoAway: true})
		case <-stop:
		}
	}()
	for {
		f := new(frame)
		if err := ss.RecvMsg(f); err != nil {
			wg.Wait()
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if f.Req == nil {
			continue
		}
		wg.Go(func() {
			ctx := ss.Context()
			if f.TimeoutMs > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(f.TimeoutMs)*time.Millisecond)
				defer cancel()
			}
			resp, err := t.serveDeliver(ctx, f.Req)
			if err != nil {
				resp = &deliverResponse{Code: codeHandlerError, Message: err.Error()}
			}
			if hook := t.onServe.Load(); hook != nil {
				(*hook)(f.Req, resp)
			}
			send(&frame{ID: f.ID, Resp: resp})
		})
	}
}

// --- client side ---

// muxCall is one request in flight on a muxStream.
type muxCall struct {
	ch   chan muxResult // 1-buffered
	sent atomic.Bool    // handed to the transport: may reach the server
}

type muxResult struct {
	resp *deliverResponse
	err  error
	sent bool
}

// muxStream is the client side of one Stream.
type muxStream struct {
	cs     grpc.ClientStream
	cancel context.CancelFunc
	sendMu sync.Mutex

	mu       sync.Mutex
	pending  map[uint64]*muxCall
	nextID   uint64
	dead     error // set once; no new calls
	draining bool  // goaway received; no new calls
}

var errStreamGone = errors.New("runner: delivery stream closed")

func newMuxStream(cc *grpc.ClientConn) (*muxStream, error) {
	ctx, cancel := context.WithCancel(context.Background())
	cs, err := cc.NewStream(ctx, &streamDesc, streamMethod)
	if err != nil {
		cancel()
		return nil, err
	}
	ms := &muxStream{cs: cs, cancel: cancel, pending: make(map[uint64]*muxCall)}
	go ms.recvLoop()
	return ms, nil
}

// usable reports whether new calls may use the stream.
func (ms *muxStream) usable() bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.dead == nil && !ms.draining
}

func (ms *muxStream) recvLoop() {
	for {
		f := new(frame)
		if err := ms.cs.RecvMsg(f); err != nil {
			ms.fail(err)
			return
		}
		ms.mu.Lock()
		var c *muxCall
		if f.GoAway {
			ms.draining = true
		} else {
			c = ms.pending[f.ID]
			delete(ms.pending, f.ID)
		}
		closeSend := ms.draining && len(ms.pending) == 0
		ms.mu.Unlock()
		if c != nil && f.Resp != nil {
			c.ch <- muxResult{resp: f.Resp, sent: true}
		}
		if closeSend { // every answer is in: let the stopping server finish
			ms.sendMu.Lock()
			_ = ms.cs.CloseSend()
			ms.sendMu.Unlock()
		}
	}
}

// fail ends the stream: calls handed to the transport may have been
// delivered; the others were not sent.
func (ms *muxStream) fail(err error) {
	ms.cancel() // unblocks a SendMsg waiting on flow control
	ms.sendMu.Lock()
	ms.mu.Lock()
	if ms.dead == nil {
		ms.dead = err
		if ms.dead == nil {
			ms.dead = errStreamGone
		}
	}
	pending := ms.pending
	ms.pending = map[uint64]*muxCall{}
	ms.mu.Unlock()
	ms.sendMu.Unlock()
	for _, c := range pending {
		if c.sent.Load() {
			c.ch <- muxResult{err: fmt.Errorf("%w: stream failed: %v", ErrMaybeDelivered, err), sent: true}
		} else {
			c.ch <- muxResult{err: fmt.Errorf("%w: stream failed: %v", ErrNotSent, err)}
		}
	}
}

// call sends req and waits for its answer. sent is false when the
// request certainly did not reach the server. Lock order: sendMu, then mu.
func (ms *muxStream) call(ctx context.Context, req *deliverRequest) (*deliverResponse, error, bool) {
	f := &frame{Req: req}
	if d, ok := ctx.Deadline(); ok {
		left := time.Until(d).Milliseconds()
		f.TimeoutMs = uint32(min(max(left, 1), math.MaxUint32))
	}
	c := &muxCall{ch: make(chan muxResult, 1)}
	ms.sendMu.Lock()
	ms.mu.Lock()
	if ms.dead != nil || ms.draining {
		ms.mu.Unlock()
		ms.sendMu.Unlock()
		return nil, fmt.Errorf("%w: stream closing", ErrNotSent), false
	}
	ms.nextID++
	f.ID = ms.nextID
	ms.pending[f.ID] = c
	ms.mu.Unlock()
	c.sent.Store(true)
	err := ms.cs.SendMsg(f)
	ms.sendMu.Unlock()
	if err != nil {
		// SendMsg fails only on a broken stream: the frame did not go out.
		ms.mu.Lock()
		_, still := ms.pending[f.ID]
		delete(ms.pending, f.ID)
		ms.mu.Unlock()
		go ms.fail(err)
		if still {
			return nil, fmt.Errorf("%w: %v", ErrNotSent, err), false
		}
		r := <-c.ch // fail got there first
		return r.resp, r.err, r.sent
	}
	select {
	case r := <-c.ch:
		return r.resp, r.err, r.sent
	case <-ctx.Done():
		ms.mu.Lock()
		delete(ms.pending, f.ID)
		ms.mu.Unlock()
		return nil, fmt.Errorf("runner: ask timed out (%w): %w", ErrMaybeDelivered, context.Cause(ctx)), true
	}
}
