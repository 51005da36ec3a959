package transport

import (
	"context"
	"encoding/binary"
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

// outFrame is a frame queued to be sent, with what to call once it was
// handed to the stream (or given up), and the bytes it holds of its
// connection's budget (0: none; an answer holds what its request took).
type outFrame struct {
	f       *frame
	written func()
	bytes   int64
}

// frameWriter coalesces the frames a server stream sends (see the top of
// the file). Its writer goroutine runs until close.
//
// A send that does not complete — the peer reads nothing, and HTTP/2 flow
// control holds the stream — holds the frames queued behind it; after
// stallAfter (the transport's watchdog, giveUpStalled) their written
// callbacks are called as given up, and those of frames queued later at
// once, until a send completes: a peer that does not read its answers
// does not hold the drains of the shards they come from. The frames
// themselves are still sent if the peer reads again.
type frameWriter struct {
	sendMsg  func(*frameBatch) error
	maxBytes int         // of a batch of more than one frame
	budget   *connBudget // given back what the answers sent held

	// The batch being sent, reused: the sending goroutine's (busy).
	out frameBatch

	// What the watchdog reads (giveUpStalled): whether a send is in
	// progress, how many completed, and whether the written callbacks of
	// the batch being sent were given up (by it) or called (after the
	// send): whoever swaps it first calls them.
	inSend     atomic.Bool
	sends      atomic.Int64
	batchGiven atomic.Bool
	// The watchdog's own: the sends it saw last and when (since clockBase).
	seenSends int64
	seenAt    time.Duration

	mu      sync.Mutex
	queue   []outFrame
	spare   []outFrame
	sending []outFrame // the batch being sent
	busy    bool       // a goroutine is sending: frames queued now go with its next batch
	stalled bool       // written callbacks are given up until a send completes
	failed  error      // a send failed: the stream is broken, frames are dropped

	kick    chan struct{} // 1-buffered: the writer goroutine has a queue to send
	quit    chan struct{}
	stopped chan struct{}
}

func newFrameWriter(send func(*frameBatch) error, maxBytes int, budget *connBudget) *frameWriter {
	w := &frameWriter{sendMsg: send, maxBytes: maxBytes, budget: budget, seenSends: -1,
		kick: make(chan struct{}, 1), quit: make(chan struct{}), stopped: make(chan struct{})}
	go w.run()
	return w
}

// send queues o.f; o.written (if not nil) is called once it was handed
// to the stream or given up, and then what it holds of the budget is
// given back. lone says that no other frame is being prepared (no other
// answer is being computed): then it goes out at once, unless another
// goroutine is sending; otherwise the writer goroutine sends it with the
// next batch.
func (w *frameWriter) send(o outFrame, lone bool) {
	w.mu.Lock()
	if w.failed != nil {
		w.mu.Unlock()
		w.done([]outFrame{o}, false)
		return
	}
	var gaveUp func()
	if w.stalled {
		gaveUp, o.written = o.written, nil
	}
	w.queue = append(w.queue, o)
	switch {
	case w.busy:
	case lone:
		w.busy = true
		w.flushLocked()
		if len(w.queue) > 0 { // queued while we sent: the writer goroutine takes over
			w.kickLocked()
		} else {
			w.busy = false
		}
	default:
		w.busy = true
		w.kickLocked()
	}
	w.mu.Unlock()
	if gaveUp != nil {
		gaveUp()
	}
}

// done calls the written callbacks of frames handed to the stream or
// given up (unless given already), then gives back what they held of the
// budget.
func (w *frameWriter) done(sent []outFrame, given bool) {
	var n, bytes int64
	for _, o := range sent {
		if o.written != nil && !given {
			o.written()
		}
		if o.bytes > 0 {
			n++
			bytes += o.bytes
		}
	}
	if n > 0 {
		w.budget.release(n, bytes)
	}
}

// giveUpStalled gives up the written callbacks of the frames queued and
// being sent if no send completed for stallAfter or more while one was in
// progress (now: since clockBase). Only the watchdog calls it.
func (w *frameWriter) giveUpStalled(now, stallAfter time.Duration) {
	if n := w.sends.Load(); !w.inSend.Load() || n != w.seenSends {
		w.seenSends, w.seenAt = n, now
		return
	}
	if now-w.seenAt < stallAfter {
		return
	}
	var calls []func()
	w.mu.Lock()
	w.stalled = true
	if w.sending != nil && !w.batchGiven.Swap(true) {
		for _, o := range w.sending {
			if o.written != nil {
				calls = append(calls, o.written)
			}
		}
	}
	for i := range w.queue {
		if w.queue[i].written != nil {
			calls = append(calls, w.queue[i].written)
			w.queue[i].written = nil
		}
	}
	w.mu.Unlock()
	for _, c := range calls {
		c()
	}
}

func (w *frameWriter) kickLocked() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// flushLocked sends one batch of the queue; w.mu is held on entry and on
// return, not while sending.
func (w *frameWriter) flushLocked() {
	batch := w.queue
	if n := batchLen(len(batch), func(i int) int { return batch[i].f.size() }, w.maxBytes); n < len(batch) {
		batch = batch[:n]
		w.queue = append(w.spare[:0], w.queue[n:]...)
	} else {
		w.queue = w.spare[:0]
	}
	w.spare = nil
	frames := w.out.Frames[:0]
	for _, o := range batch {
		frames = append(frames, o.f)
	}
	w.out.Frames = frames
	w.sending = batch
	w.batchGiven.Store(false)
	w.mu.Unlock()
	w.inSend.Store(true)
	err := w.sendMsg(&w.out) // encoded before it returns
	clear(frames)
	w.inSend.Store(false)
	w.sends.Add(1)
	w.done(batch, w.batchGiven.Swap(true))
	w.mu.Lock()
	w.sending = nil
	clear(batch) // (giveUpStalled reads w.sending under mu)
	if err == nil {
		w.stalled = false
	}
	if err != nil && w.failed == nil {
		w.failed = err
	}
	if w.failed != nil { // the stream is broken: what is queued is given up
		dropped := w.queue
		w.queue = nil
		w.mu.Unlock()
		w.done(dropped, false)
		w.mu.Lock()
	}
	if w.spare == nil {
		w.spare = batch[:0]
	}
}

// run is the writer goroutine: it sends what queued up while another
// goroutine was sending.
func (w *frameWriter) run() {
	defer close(w.stopped)
	for {
		select {
		case <-w.kick:
		case <-w.quit:
			w.drain()
			return
		}
		// Let the goroutines about to queue answers do so first.
		runtime.Gosched()
		w.drain()
	}
}

func (w *frameWriter) drain() {
	w.mu.Lock()
	for len(w.queue) > 0 {
		w.flushLocked()
	}
	w.busy = false
	w.mu.Unlock()
}

// close sends what is queued and stops the writer goroutine. No frame
// may be sent after it is called.
func (w *frameWriter) close() {
	close(w.quit)
	<-w.stopped
}

// stallAfter is how long a send of answers may wait for the peer to read
// before the written callbacks of the answers waiting for it are given up
// (frameWriter): 1-1.5 s after the send started (the watchdog looks every
// stallAfter/4).
const stallAfter = time.Second

// writerSet is the frame writers of a transport's open delivery streams,
// which its watchdog looks at.
type writerSet struct {
	mu sync.Mutex
	m  map[*frameWriter]struct{}
}

func (s *writerSet) add(w *frameWriter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = make(map[*frameWriter]struct{})
	}
	s.m[w] = struct{}{}
}

func (s *writerSet) remove(w *frameWriter) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, w)
}

// watch gives up the written callbacks of stalled writers (giveUpStalled)
// every after/4 until stop is closed: a send stalled is seen within
// after/4, given up after + after/4 later at most.
func (s *writerSet) watch(after time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(after / 4)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-stop:
			return
		}
		s.mu.Lock()
		ws := make([]*frameWriter, 0, len(s.m))
		for w := range s.m {
			ws = append(ws, w)
		}
		s.mu.Unlock()
		now := time.Since(clockBase)
		for _, w := range ws {
			w.giveUpStalled(now, after)
		}
	}
}

// --- client side ---

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
