package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
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
func (t *GRPC) serveStream(ss grpc.ServerStream) error {
	var (
		sendMu sync.Mutex
		wg     sync.WaitGroup
	)
	send := func(f *frame) {
		sendMu.Lock()
		defer sendMu.Unlock()
		_ = ss.SendMsg(f) // an error ends the stream; RecvMsg reports it
	}
	stop, goawayDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(goawayDone)
		select {
		case <-t.goaway:
			send(&frame{GoAway: true})
		case <-stop:
		}
	}()
	defer func() { close(stop); <-goawayDone }() // no SendMsg after we return
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
			resp, written := t.h.Deliver(ctx, f.Req)
			send(&frame{ID: f.ID, Resp: resp})
			written()
		})
	}
}

// --- client side ---

type muxResult struct {
	resp *DeliverResponse
	err  error
	sent bool
}

// muxStream is the client side of one Stream.
type muxStream struct {
	cs     grpc.ClientStream
	cancel context.CancelFunc
	sendMu sync.Mutex

	mu       sync.Mutex
	pending  map[uint64]chan muxResult // 1-buffered; registered under sendMu
	nextID   uint64
	dead     error // set once; no new calls
	draining bool  // goaway received; no new calls
}

func newMuxStream(cc *grpc.ClientConn) (*muxStream, error) {
	ctx, cancel := context.WithCancel(context.Background())
	cs, err := cc.NewStream(ctx, &streamDesc, streamMethod)
	if err != nil {
		cancel()
		return nil, err
	}
	ms := &muxStream{cs: cs, cancel: cancel, pending: make(map[uint64]chan muxResult)}
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
		// A frame answers the call with its ID (IDs start at 1; a server's
		// goaway frame has ID 0) and may also say goaway. A frame with the
		// ID of a call but no response breaks the protocol: the call fails
		// with ErrMaybeDelivered rather than wait for its deadline.
		ms.mu.Lock()
		if f.GoAway {
			ms.draining = true
		}
		c := ms.pending[f.ID]
		delete(ms.pending, f.ID)
		closeSend := ms.draining && len(ms.pending) == 0
		ms.mu.Unlock()
		switch {
		case c != nil && f.Resp != nil:
			c <- muxResult{resp: f.Resp, sent: true}
		case c != nil:
			c <- muxResult{err: fmt.Errorf("%w: frame %d from the server carries no answer", ErrMaybeDelivered, f.ID), sent: true}
		}
		if closeSend { // every answer is in: let the stopping server finish
			ms.sendMu.Lock()
			_ = ms.cs.CloseSend()
			ms.sendMu.Unlock()
		}
	}
}

// fail ends the stream (err is not nil): the calls pending may have been
// delivered. A call whose own SendMsg failed ignores this answer and
// reports not sent.
func (ms *muxStream) fail(err error) {
	ms.cancel() // unblocks a SendMsg waiting on flow control
	ms.sendMu.Lock()
	ms.mu.Lock()
	if ms.dead == nil {
		ms.dead = err
	}
	pending := ms.pending
	ms.pending = map[uint64]chan muxResult{}
	ms.mu.Unlock()
	ms.sendMu.Unlock()
	for _, c := range pending {
		c <- muxResult{err: fmt.Errorf("%w: stream failed: %v", ErrMaybeDelivered, err), sent: true}
	}
}

// call sends req and waits for its answer. sent is false when the
// request certainly did not reach the server. Lock order: sendMu, then mu.
func (ms *muxStream) call(ctx context.Context, req *DeliverRequest) (*DeliverResponse, error, bool) {
	f := &frame{Req: req}
	if d, ok := ctx.Deadline(); ok {
		left := time.Until(d).Milliseconds()
		f.TimeoutMs = uint32(min(max(left, 1), math.MaxUint32))
	}
	c := make(chan muxResult, 1)
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
	err := ms.cs.SendMsg(f)
	ms.sendMu.Unlock()
	if err != nil {
		// SendMsg fails only on a broken stream: the frame did not go out
		// (also when fail, unblocking it, already answered c).
		ms.mu.Lock()
		delete(ms.pending, f.ID)
		ms.mu.Unlock()
		go ms.fail(err)
		return nil, fmt.Errorf("%w: %v", ErrNotSent, err), false
	}
	select {
	case r := <-c:
		return r.resp, r.err, r.sent
	case <-ctx.Done():
		ms.mu.Lock()
		delete(ms.pending, f.ID)
		ms.mu.Unlock()
		return nil, fmt.Errorf("runner: ask timed out (%w): %w", ErrMaybeDelivered, context.Cause(ctx)), true
	}
}
