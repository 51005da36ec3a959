package transport

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/shardhost/shardhost/transport/lazydeadline"
)

// The multiplexed delivery stream (transport.proto, rpc Frames). A unary
// RPC per message costs a new HTTP/2 stream, headers and trailers both
// ways; one long-lived stream per connection carries only the messages.
//
// Each side coalesces the frames it sends: a frame joins the stream's
// queue, and the queue goes out as one stream message (a frameBatch: one
// gRPC message, one HTTP/2 data frame, usually one write). A frame with
// nothing else under way — the client's call when no other call on the
// stream awaits its answer, the server's answer when no other answer is
// being computed — is sent at once by the goroutine that made it. Else
// the stream's writer goroutine sends it: woken, it yields once (so that
// the goroutines about to queue frames, callers woken by answers or
// handlers finishing, do so) and sends the whole queue. Frames queued
// while a batch is being sent go with the next. Nothing waits for a
// timer: batches grow only under load. The reader decodes a batch in one
// allocation; the server answers its frames on reused goroutines.
//
// The server still answers rpc Stream (a frame per message), which
// runners of the previous version call, and a client whose Frames stream
// the server refuses as unimplemented (a runner of the previous version:
// nothing was delivered, its calls are told ErrNotSent) uses rpc Stream
// with that peer from then on.

const (
	streamMethod = "/shardhost.v1.Runner/Stream"
	framesMethod = "/shardhost.v1.Runner/Frames"
)

var (
	framesDesc = grpc.StreamDesc{StreamName: "Frames", ServerStreams: true, ClientStreams: true}
	streamDesc = grpc.StreamDesc{StreamName: "Stream", ServerStreams: true, ClientStreams: true}
)

// maxBatchFrames and maxBatchBytes bound a batch of more than one frame,
// so that one sender's burst does not hold back the others' answers
// behind one huge write; a batch's bytes also stay within the sender's
// MaxMessageSize (the stream's message limit: a message over it would
// fail the send and the stream). A frame alone may be larger.
const (
	maxBatchFrames = 256
	maxBatchBytes  = 1 << 20
)

// batchBytes is the bound of a batch's bytes for MaxMessageSize limit.
func batchBytes(limit int) int {
	if limit <= 0 {
		return maxBatchBytes
	}
	return min(limit, maxBatchBytes)
}

// batchLen is how many of the first frames of a queue of n make a batch:
// at most maxBatchFrames, their sizes (size(i): an upper bound) within
// limit bytes, and at least one.
func batchLen(n int, size func(i int) int, limit int) int {
	total := 0
	for i := range min(n, maxBatchFrames) {
		total += binary.MaxVarintLen64 + 1 + size(i)
		if total > limit && i > 0 {
			return i
		}
	}
	return min(n, maxBatchFrames)
}

// --- server side ---

// serveStream answers rpc Stream (a frame per message, both ways: what
// runners of the previous version call) as serveDeliveries does.
func (t *GRPC) serveStream(ss grpc.ServerStream) error {
	recv := func() ([]*frame, error) {
		f := new(frame)
		if err := ss.RecvMsg(f); err != nil {
			return nil, err
		}
		return []*frame{f}, nil
	}
	send := func(b *frameBatch) error {
		for _, f := range b.Frames {
			if err := ss.SendMsg(f); err != nil {
				return err
			}
		}
		return nil
	}
	return t.serveDeliveries(ss, recv, send)
}

// serveFrames answers rpc Frames (batches of frames both ways) as
// serveDeliveries does.
func (t *GRPC) serveFrames(ss grpc.ServerStream) error {
	var b frameBatch // the reader's, reused
	recv := func() ([]*frame, error) {
		err := ss.RecvMsg(&b)
		return b.Frames, err
	}
	return t.serveDeliveries(ss, recv, func(b *frameBatch) error { return ss.SendMsg(b) })
}

// serveDeliveries answers the frames of one delivery stream (recv reads
// the next message's frames, send sends a batch of answers), each on a
// goroutine of its own while it runs (a worker, reused), until the client
// closes its side; answers are coalesced. When the transport stops
// gracefully it sends a goaway frame and keeps answering what arrives
// until the client, having received every answer, closes its side. It
// reads a request only within its connection's budget (bounds.go), which
// also bounds the workers.
func (t *GRPC) serveDeliveries(ss grpc.ServerStream, recv func() ([]*frame, error), send func(*frameBatch) error) error {
	budget, key := t.budgets.acquire(ss)
	defer t.budgets.put(key, budget)
	var (
		wg       sync.WaitGroup
		handlers atomic.Int64 // answers being computed
		idle     atomic.Int64 // workers waiting on work
		work     = make(chan *frame)
	)
	w := newFrameWriter(send, batchBytes(t.cfg.MaxMessageSize), budget)
	t.writers.add(w)
	stop, goawayDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(goawayDone)
		select {
		case <-t.goaway:
			w.send(outFrame{f: &frame{GoAway: true}}, true)
		case <-stop:
		}
	}()
	// No SendMsg after we return: the goaway goroutine, then the writer.
	defer func() { close(stop); <-goawayDone; w.close(); t.writers.remove(w) }()
	serve := func(ctx context.Context, f *frame) {
		size := int64(f.Req.size()) // as taken, before the handler sees the request
		if f.TimeoutMs > 0 {
			// No timer unless something waits for the deadline: most
			// frames are answered without (lazydeadline).
			c := lazydeadline.WithDeadlineCause(ctx, time.Now().Add(time.Duration(f.TimeoutMs)*time.Millisecond), nil)
			defer c.Cancel()
			ctx = c
		}
		resp, written := t.h.Deliver(ctx, f.Req)
		// The answer goes out in the request's frame: nothing else refers
		// to it once the handler returned.
		out := f
		*out = frame{ID: f.ID, Resp: resp}
		answer := int64(out.size())
		budget.resize(answer - size)
		w.send(outFrame{f: out, written: written, bytes: answer}, handlers.Add(-1) == 0)
	}
	// A worker answers frames one after another, waiting for the next
	// (at most maxIdleWorkers wait): a new goroutine per frame would grow
	// its stack anew for every message (the request is decoded on it), a
	// cost that showed in the profiles of remote asks.
	worker := func(f *frame) {
		// The frames' contexts derive from the worker's own, not each
		// directly from the stream's: they register with a parent no other
		// goroutine locks.
		ctx, cancel := context.WithCancel(ss.Context())
		defer cancel()
		for {
			serve(ctx, f)
			if idle.Add(1) > maxIdleWorkers {
				idle.Add(-1)
				return
			}
			var ok bool
			if f, ok = <-work; !ok {
				return
			}
			idle.Add(-1)
		}
	}
	// dispatch hands f to a waiting worker or to a new one, within the
	// connection's workers (else it waits for either); false when done
	// closed first.
	done := ss.Context().Done()
	dispatch := func(f *frame) bool {
		for {
			select {
			case work <- f:
				return true
			default:
			}
			if budget.addWorker() {
				wg.Go(func() { defer budget.workerDone(); worker(f) })
				return true
			}
			freed := budget.await()
			if budget.workers.Load() < maxConnRequests {
				budget.waiting.Add(-1)
				continue
			}
			select {
			case work <- f:
				budget.waiting.Add(-1)
				return true
			case <-freed:
				budget.waiting.Add(-1)
			case <-done:
				budget.waiting.Add(-1)
				return false
			}
		}
	}
	defer func() { close(work); wg.Wait() }()
	for {
		frames, err := recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		for _, f := range frames {
			if f.Req == nil {
				continue
			}
			if !budget.take(int64(f.Req.size()), done) {
				return status.FromContextError(ss.Context().Err()).Err()
			}
			handlers.Add(1)
			if !dispatch(f) {
				handlers.Add(-1)
				budget.release(1, int64(f.Req.size()))
				return status.FromContextError(ss.Context().Err()).Err()
			}
		}
	}
}

// maxIdleWorkers bounds the goroutines a delivery stream keeps waiting
// for frames to answer.
const maxIdleWorkers = 16
