package transport

import (
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
)

// What a peer can make a runner hold (doc.go, "Bounds"): the size of a
// message, the streams of a connection, and the requests read on a
// connection's delivery streams whose answers are not handed back yet.

// messageEnvelope is what a message may carry besides its payload: its
// strings (kind, method, entity, sender, codec), headers (a request
// keeps at most maxHeaderBytes of them) and framing.
const messageEnvelope = 64 << 10

// messageLimit is the largest message a transport with MaxMessageSize
// limit receives or sends, on every RPC: a payload of limit bytes with
// its envelope.
func messageLimit(limit int) int { return limit + messageEnvelope }

// maxStreamsPerConn bounds the RPCs open at once on one connection
// (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS): a runner uses one delivery
// stream per connection, plus a unary call per request over
// maxStreamPayload and per Hot call; a peer's further calls wait for a
// slot (gRPC queues them), a hostile peer's further streams are refused.
const maxStreamsPerConn = 32

// The bounds of what the delivery streams (rpc Frames and rpc Stream) of
// one connection hold: requests read whose answer is not handed to the
// stream yet — handlers running, answers queued behind a peer that does
// not read them. Past either bound a stream's reader stops reading until
// answers go out: the peer's further frames wait in its HTTP/2 stream
// window, then in the peer (flow control).
const (
	// maxConnRequests bounds their number, and the number of the
	// workers (goroutines running handlers, or waiting for one) of the
	// connection's streams.
	maxConnRequests = 4096
	// minConnBytes is the least of the bound of their bytes (requests
	// read, then their answers), connBytes.
	minConnBytes = 16 << 20
)

// connBytes is the bound of the bytes of the requests and answers a
// connection's delivery streams hold, for MaxMessageSize limit: 16 MiB,
// or four of the largest messages if that is more. A request alone is
// read whatever its size.
func connBytes(limit int) int64 { return max(minConnBytes, 4*int64(messageLimit(limit))) }

// connBudget counts what a connection's delivery streams hold (see
// maxConnRequests). Each stream's reader takes from it before it hands a
// request to a handler, and the stream gives back once the answer is
// handed to gRPC (or given up). It also counts the streams' workers,
// maxConnRequests at most. Safe for concurrent use.
type connBudget struct {
	maxBytes          int64
	n, bytes, workers atomic.Int64
	waiting           atomic.Int32 // readers waiting for a release

	mu    sync.Mutex
	freed chan struct{} // closed at the next release while readers wait
	users int           // streams using the budget (under connBudgets.mu)
}

// fits reports whether a request of size bytes may be taken now.
func (b *connBudget) fits(size int64) bool {
	n := b.n.Load()
	return n == 0 || n < maxConnRequests && b.bytes.Load()+size <= b.maxBytes
}

// take accounts a request of size bytes, waiting while the budget is
// spent; false when done closed first (nothing taken). The count is
// taken atomically (never past maxConnRequests); streams of one
// connection taking at once may pass the byte bound by a request each.
func (b *connBudget) take(size int64, done <-chan struct{}) bool {
	for {
		for !b.fits(size) {
			freed := b.await()
			// Registered before this check: a release after it closes freed.
			if !b.fits(size) {
				select {
				case <-freed:
				case <-done:
					b.waiting.Add(-1)
					return false
				}
			}
			b.waiting.Add(-1)
		}
		if n := b.n.Load(); (n == 0 || n < maxConnRequests) && b.n.CompareAndSwap(n, n+1) {
			b.bytes.Add(size)
			return true
		}
	}
}

// await registers a reader waiting for the next release and returns the
// channel closed then; the reader unregisters (waiting.Add(-1)) when done
// waiting.
func (b *connBudget) await() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.freed == nil {
		b.freed = make(chan struct{})
	}
	b.waiting.Add(1)
	return b.freed
}

// addWorker counts a new worker if there are fewer than maxConnRequests.
func (b *connBudget) addWorker() bool {
	if b.workers.Add(1) <= maxConnRequests {
		return true
	}
	b.workerDone()
	return false
}

// workerDone gives back a worker addWorker counted.
func (b *connBudget) workerDone() {
	b.workers.Add(-1)
	b.wake()
}

// resize changes the bytes accounted for a request by delta: its answer
// replaces it.
func (b *connBudget) resize(delta int64) {
	b.bytes.Add(delta)
	if delta < 0 {
		b.wake()
	}
}

// release gives back n requests of bytes in all.
func (b *connBudget) release(n, bytes int64) {
	b.bytes.Add(-bytes)
	b.n.Add(-n)
	b.wake()
}

func (b *connBudget) wake() {
	if b.waiting.Load() == 0 {
		return
	}
	b.mu.Lock()
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
	b.mu.Unlock()
}

// connBudgets are the budgets of the connections whose delivery streams
// are open, by the peer's address (one per connection: its port).
type connBudgets struct {
	maxBytes int64
	mu       sync.Mutex
	m        map[string]*connBudget
}

// acquire returns the budget of ss's connection; release it with put.
func (c *connBudgets) acquire(ss grpc.ServerStream) (*connBudget, string) {
	key := ""
	if p, ok := peer.FromContext(ss.Context()); ok && p.Addr != nil {
		key = p.Addr.String()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]*connBudget)
	}
	b := c.m[key]
	if b == nil {
		b = &connBudget{maxBytes: c.maxBytes}
		if b.maxBytes <= 0 {
			b.maxBytes = minConnBytes
		}
		c.m[key] = b
	}
	b.users++
	return b, key
}

// put gives back a budget acquire returned.
func (c *connBudgets) put(key string, b *connBudget) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b.users--; b.users == 0 && c.m[key] == b {
		delete(c.m, key)
	}
}
