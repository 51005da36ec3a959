package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The client side of the multiplexed delivery stream (mux.go says how it
// works): a muxStream per connection, its calls and its writer.

type muxResult struct {
	resp *DeliverResponse
	err  error
	sent bool
}

// muxCall is one call's frame and answer channel (1-buffered), reused
// (muxStream.calls) once the call received its answer: by then its frame
// was sent, and the channel is empty and no longer anyone's.
type muxCall struct {
	f frame
	c chan muxResult
}

// muxStream is the client side of one Frames stream.
type muxStream struct {
	cs     grpc.ClientStream
	cancel context.CancelFunc
	sendMu sync.Mutex // held while sending on cs

	mu       sync.Mutex
	pending  map[uint64]chan muxResult // 1-buffered; queued or sent, not answered
	queue    []*frame                  // queued, not handed to cs yet (all in pending)
	spare    []*frame
	busy     bool // a goroutine is sending: frames queued now go with its next batch
	nextID   uint64
	dead     error       // set once; no new calls
	draining bool        // goaway received; no new calls
	closing  atomic.Bool // dead or draining (read without mu)

	kick     chan struct{} // 1-buffered: the writer goroutine has a queue to send
	done     chan struct{} // closed when dead is set
	maxBytes int           // of a batch of more than one frame
	// timers are the stopped timers of calls whose context has no
	// deadline (the stream's own: a timer made in a synctest bubble stays
	// in it).
	timers sync.Pool
	// calls are the muxCalls of calls that received their answer (the
	// stream's own, like timers: a channel made in a synctest bubble must
	// not be used outside it).
	calls sync.Pool
	// out is the batch being sent, reused (under sendMu).
	out frameBatch

	// legacy: the stream is an rpc Stream (a frame per message), for a
	// server of the previous version. unimplemented: the server does
	// not know rpc Frames (set before done is closed).
	legacy, unimplemented bool
}

// newMuxStream opens a delivery stream on cc: rpc Frames, or rpc Stream
// when legacy. Opening it waits at most wait (0: no bound) for a stream
// slot on the connection (the server allows maxStreamsPerConn at once).
func newMuxStream(cc *grpc.ClientConn, legacy bool, maxMessageSize int, wait time.Duration) (*muxStream, error) {
	ctx, cancel := context.WithCancel(context.Background())
	desc, method := &framesDesc, framesMethod
	if legacy {
		desc, method = &streamDesc, streamMethod
	}
	var timer *time.Timer
	if wait > 0 {
		timer = time.AfterFunc(wait, cancel)
	}
	cs, err := cc.NewStream(ctx, desc, method)
	if err == nil && timer != nil && !timer.Stop() {
		err = fmt.Errorf("no stream slot on the connection within %v", wait)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	ms := newMux(cs, cancel)
	ms.legacy = legacy
	ms.maxBytes = batchBytes(maxMessageSize)
	go ms.recvLoop()
	go ms.writeLoop()
	return ms, nil
}

// newMux returns the client of stream cs; its goroutines (recvLoop and
// writeLoop) are the caller's to start.
func newMux(cs grpc.ClientStream, cancel context.CancelFunc) *muxStream {
	return &muxStream{cs: cs, cancel: cancel, pending: make(map[uint64]chan muxResult), maxBytes: maxBatchBytes,
		kick: make(chan struct{}, 1), done: make(chan struct{})}
}

// usable reports whether new calls may use the stream.
func (ms *muxStream) usable() bool { return !ms.closing.Load() }

// refused reports whether the server refused the stream as
// unimplemented (it does not know rpc Frames).
func (ms *muxStream) refused() bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.unimplemented
}

func (ms *muxStream) recvLoop() {
	var b frameBatch // reused
	for {
		if ms.legacy {
			f := new(frame)
			if err := ms.cs.RecvMsg(f); err != nil {
				ms.fail(err)
				return
			}
			ms.receive(f)
			continue
		}
		if err := ms.cs.RecvMsg(&b); err != nil {
			ms.fail(err)
			return
		}
		for _, f := range b.Frames {
			ms.receive(f)
		}
	}
}

// receive handles one frame from the server.
func (ms *muxStream) receive(f *frame) {
	// A frame answers the call with its ID (IDs start at 1; a server's
	// goaway frame has ID 0) and may also say goaway. A frame with the
	// ID of a call but no response breaks the protocol: the call fails
	// with ErrMaybeDelivered rather than wait for its deadline.
	ms.mu.Lock()
	if f.GoAway {
		ms.draining = true
		ms.closing.Store(true)
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

// fail ends the stream (err is not nil): the calls sent may have been
// delivered; those still queued were not sent, nor were any when the
// server does not know rpc Frames (it refuses the stream before reading
// a message).
func (ms *muxStream) fail(err error) {
	ms.cancel() // unblocks a SendMsg waiting on flow control
	ms.sendMu.Lock()
	ms.mu.Lock()
	if ms.dead == nil {
		ms.dead = err
		ms.closing.Store(true)
		ms.unimplemented = !ms.legacy && status.Code(err) == codes.Unimplemented
		close(ms.done)
	}
	queued := ms.queue
	ms.queue = nil
	var notSent []chan muxResult
	for _, f := range queued {
		if c, ok := ms.pending[f.ID]; ok {
			delete(ms.pending, f.ID)
			notSent = append(notSent, c)
		}
	}
	if ms.unimplemented {
		for id, c := range ms.pending {
			delete(ms.pending, id)
			notSent = append(notSent, c)
		}
	}
	pending := ms.pending
	ms.pending = map[uint64]chan muxResult{}
	ms.mu.Unlock()
	ms.sendMu.Unlock()
	why := "stream failed before the request was sent"
	if ms.unimplemented {
		why = "the peer does not know rpc Frames (a runner of the previous version)"
	}
	for _, c := range notSent {
		c <- muxResult{err: fmt.Errorf("%w: %s: %v", ErrNotSent, why, err)}
	}
	for _, c := range pending {
		c <- muxResult{err: fmt.Errorf("%w: stream failed: %v", ErrMaybeDelivered, err), sent: true}
	}
}

// call sends req and waits for its answer, bounded by ctx or, when ctx
// has no deadline, by timeout. sent is false when the request certainly
// did not reach the server. Lock order: sendMu, then mu.
func (ms *muxStream) call(ctx context.Context, req *DeliverRequest, timeout time.Duration) (*DeliverResponse, error, bool) {
	mc, _ := ms.calls.Get().(*muxCall)
	if mc == nil {
		mc = &muxCall{c: make(chan muxResult, 1)}
	}
	f, c := &mc.f, mc.c
	f.Req = req
	var expired <-chan time.Time
	if d, ok := ctx.Deadline(); ok {
		left := time.Until(d).Milliseconds()
		f.TimeoutMs = uint32(min(max(left, 1), math.MaxUint32))
	} else {
		// A timer rather than a context: less to allocate and to cancel;
		// reused (stopped timers are safe to Reset, and none of its fires
		// is received after Stop).
		f.TimeoutMs = uint32(min(max(timeout.Milliseconds(), 1), math.MaxUint32))
		t, _ := ms.timers.Get().(*time.Timer)
		if t == nil {
			t = time.NewTimer(timeout)
		} else {
			t.Reset(timeout)
		}
		defer func() {
			t.Stop()
			ms.timers.Put(t)
		}()
		expired = t.C
	}
	ms.mu.Lock()
	if ms.dead != nil || ms.draining {
		ms.mu.Unlock()
		*f = frame{}
		ms.calls.Put(mc)
		return nil, fmt.Errorf("%w: stream closing", ErrNotSent), false
	}
	ms.nextID++
	f.ID = ms.nextID
	idle := len(ms.pending) == 0
	ms.pending[f.ID] = c
	ms.queue = append(ms.queue, f)
	switch {
	case ms.busy:
	case idle: // a lone call: send it now
		ms.busy = true
		ms.flushLocked()
		if len(ms.queue) > 0 {
			ms.kickLocked()
		} else {
			ms.busy = false
		}
	default: // calls in flight: the writer goroutine batches this one with the next
		ms.busy = true
		ms.kickLocked()
	}
	ms.mu.Unlock()
	var cause error
	select {
	case r := <-c:
		// Its one sender removed it from pending before sending; its
		// frame was sent (or given up) before that.
		*f = frame{}
		ms.calls.Put(mc)
		return r.resp, r.err, r.sent
	case <-ctx.Done():
		cause = context.Cause(ctx)
	case <-expired:
		cause = context.DeadlineExceeded
	}
	ms.mu.Lock()
	delete(ms.pending, f.ID)
	if i := slices.Index(ms.queue, f); i >= 0 { // still queued: never sent
		ms.queue = slices.Delete(ms.queue, i, i+1)
		ms.mu.Unlock()
		return nil, fmt.Errorf("%w: the context ended before the request was sent: %w", ErrNotSent, cause), false
	}
	ms.mu.Unlock()
	return nil, fmt.Errorf("runner: ask timed out (%w): %w", ErrMaybeDelivered, cause), true
}

// flushLocked sends one batch of the queue; ms.mu is held on entry and on
// return, not while sending. The calls of a batch whose send fails are
// told it was not sent (the stream fails): a failed SendMsg sent nothing.
func (ms *muxStream) flushLocked() {
	if ms.dead != nil {
		return // fail answered the queue
	}
	batch := ms.queue
	if n := batchLen(len(batch), func(i int) int { return batch[i].size() }, ms.maxBytes); n < len(batch) {
		batch = batch[:n]
		ms.queue = append(ms.spare[:0], ms.queue[n:]...)
	} else {
		ms.queue = ms.spare[:0]
	}
	ms.spare = nil
	ms.mu.Unlock()
	ms.sendMu.Lock()
	if ms.closing.Load() && ms.failed() {
		// fail ran since the batch left the queue: it answered these calls
		// (their frames may be reused from then on); nothing is sent.
		ms.sendMu.Unlock()
		clear(batch)
		ms.mu.Lock()
		return
	}
	var err error
	failed := batch // the frames not sent if err is not nil
	if ms.legacy {
		for i, f := range batch {
			if err = ms.cs.SendMsg(f); err != nil {
				failed = batch[i:]
				break
			}
		}
	} else {
		ms.out.Frames = batch
		err = ms.cs.SendMsg(&ms.out) // encoded before it returns
		ms.out.Frames = nil
	}
	var notSent []chan muxResult
	if err != nil {
		// Under sendMu, so that fail cannot report these calls as maybe
		// delivered first.
		ms.mu.Lock()
		for _, f := range failed {
			if c, ok := ms.pending[f.ID]; ok {
				delete(ms.pending, f.ID)
				notSent = append(notSent, c)
			}
		}
		ms.mu.Unlock()
	}
	ms.sendMu.Unlock()
	ended := errors.Is(err, io.EOF)
	if ended {
		// The server ended the stream: recvLoop learns its status and
		// fails the stream with it. Waiting for that tells these calls
		// why, and a stream opened for the next call whether the peer
		// knows rpc Frames (refused).
		<-ms.done
		ms.mu.Lock()
		err = ms.dead
		ms.mu.Unlock()
	}
	for _, c := range notSent {
		c <- muxResult{err: fmt.Errorf("%w: %v", ErrNotSent, err)}
	}
	if err != nil && !ended {
		go ms.fail(err)
	}
	clear(batch)
	ms.mu.Lock()
	if ms.spare == nil {
		ms.spare = batch[:0]
	}
}

// failed reports whether fail ended the stream.
func (ms *muxStream) failed() bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.dead != nil
}

func (ms *muxStream) kickLocked() {
	select {
	case ms.kick <- struct{}{}:
	default:
	}
}

// writeLoop is the stream's writer goroutine: it sends what queued up
// while another goroutine was sending, until the stream fails.
func (ms *muxStream) writeLoop() {
	for {
		select {
		case <-ms.kick:
		case <-ms.done:
			return
		}
		// Let the goroutines that are about to queue frames (callers woken
		// by answers) do so first: flushed when they are done, the batch
		// holds them all.
		runtime.Gosched()
		ms.mu.Lock()
		for len(ms.queue) > 0 && ms.dead == nil {
			ms.flushLocked()
		}
		ms.busy = false
		ms.mu.Unlock()
	}
}
