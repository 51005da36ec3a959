package transport

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// outFrame is a frame queued to be sent, with what to call once it was
// handed to the stream (or given up), and the bytes it holds of its
// connection's budget (0: none; an answer holds what its request took).
type outFrame struct {
	f       *frame
	written func()
	bytes   int64
}

// frameWriter coalesces the frames a server stream sends (see the top of
// mux.go). Its writer goroutine runs until close.
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
