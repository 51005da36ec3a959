package transport

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// InmemNetwork connects Inmem transports by address inside one process,
// like hashicorp/raft's InmemTransport: a delivery is a function call on a
// goroutine of the receiving transport, with the messages encoded and
// decoded as on the wire, so no memory is shared. Faults can be injected
// between addresses (unreachable, lost answers, latency). It uses only
// goroutines, channels and timers, so a whole cluster of runners on it and
// on storage/memory runs inside a testing/synctest bubble (create the
// network inside the bubble). Safe for concurrent use.
type InmemNetwork struct {
	mu      sync.Mutex
	nodes   map[string]*Inmem // listening transports by address
	cut     map[[2]string]bool
	lost    map[string]bool // answers from these addresses are lost
	latency time.Duration

	// ConnectTimeout is how long a call to an unreachable address waits
	// before failing with ErrNotSent (as the gRPC transport waits for a
	// connection). Default 1 s. Set before use.
	ConnectTimeout time.Duration
	// MaxMessageSize bounds request payloads (ErrMessageTooLarge, not
	// sent). Default 4 MiB. Set before use.
	MaxMessageSize int
}

// NewInmemNetwork returns an empty network.
func NewInmemNetwork() *InmemNetwork {
	return &InmemNetwork{
		nodes: map[string]*Inmem{}, cut: map[[2]string]bool{}, lost: map[string]bool{},
		ConnectTimeout: time.Second, MaxMessageSize: 4 << 20,
	}
}

// Transport returns a transport of the network whose address is addr:
// peers reach it there once it listens, and faults name it by it. A
// runner publishes it in its record, which requires host:port (e.g.
// "a:7100").
func (n *InmemNetwork) Transport(addr string) *Inmem {
	return &Inmem{n: n, addr: addr, calls: map[uint64]*inmemCall{}}
}

// Cut makes calls from a to b (and b's answers to a) fail as if there were
// no connection (on), or work again (off). One direction only: cut both
// for a partition.
func (n *InmemNetwork) Cut(from, to string, on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[[2]string{from, to}] = on
}

// Isolate cuts addr from every other address, both ways (on), or heals it.
func (n *InmemNetwork) Isolate(addr string, on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cut[[2]string{addr, "*"}] = on
	n.cut[[2]string{"*", addr}] = on
}

// LoseAnswers makes the answers of the transport at addr vanish (on): its
// handlers run, and their callers wait until their context ends
// (ErrMaybeDelivered).
func (n *InmemNetwork) LoseAnswers(addr string, on bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lost[addr] = on
}

// SetLatency delays every request and every answer by d.
func (n *InmemNetwork) SetLatency(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.latency = d
}

// route returns the transport at to if from can reach it now.
func (n *InmemNetwork) route(from, to string) (*Inmem, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut[[2]string{from, to}] || n.cut[[2]string{from, "*"}] || n.cut[[2]string{"*", to}] {
		return nil, false
	}
	t, ok := n.nodes[to]
	return t, ok
}

func (n *InmemNetwork) answersLost(addr string) (lost bool, latency time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.lost[addr], n.latency
}

// Inmem is a transport of an InmemNetwork.
type Inmem struct {
	n    *InmemNetwork
	addr string

	mu       sync.Mutex
	h        Handler
	stopping bool // no new deliveries
	closed   bool // no calls either
	nextID   uint64
	calls    map[uint64]*inmemCall // deliveries this transport is answering
	cancel   []context.CancelFunc
	wg       sync.WaitGroup // delivery goroutines
}

var _ Transport = (*Inmem)(nil)

// inmemCall is one delivery being answered: its caller waits on answer.
type inmemCall struct {
	answer chan []byte // the encoded answer; closed when the connection drops
	cancel context.CancelFunc
}

// Addr returns the transport's address.
func (t *Inmem) Addr() string { return t.addr }

// Listen implements Transport: the transport answers at its address.
func (t *Inmem) Listen(h Handler) (string, error) {
	t.mu.Lock()
	t.h = h
	t.mu.Unlock()
	t.n.mu.Lock()
	defer t.n.mu.Unlock()
	if other, ok := t.n.nodes[t.addr]; ok && other != t {
		return "", fmt.Errorf("transport: address %s in use", t.addr)
	}
	t.n.nodes[t.addr] = t
	return t.addr, nil
}

var _ RouteCaller = (*Inmem)(nil)

// Call implements Transport.
func (t *Inmem) Call(ctx context.Context, addr string, req *DeliverRequest) (*DeliverResponse, bool, error) {
	return t.CallRoute(ctx, addr, req, nil)
}

// CallRoute implements RouteCaller.
func (t *Inmem) CallRoute(ctx context.Context, addr string, req *DeliverRequest, route Route) (*DeliverResponse, bool, error) {
	if len(req.Payload) > t.n.MaxMessageSize {
		return nil, false, fmt.Errorf("%w: request of %d bytes (limit %d)", ErrMessageTooLarge, len(req.Payload), t.n.MaxMessageSize)
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, false, ErrClosed
	}
	peer, err := t.connect(ctx, addr, route)
	if err != nil {
		return nil, false, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
	}
	answer, ok := peer.receive(ctx, req.Marshal())
	if !ok {
		return nil, false, fmt.Errorf("%w: %s is stopping", ErrNotSent, addr)
	}
	select {
	case b, ok := <-answer:
		if !ok {
			return nil, true, fmt.Errorf("%w: to %s: connection lost", ErrMaybeDelivered, addr)
		}
		resp := new(DeliverResponse)
		if err := resp.Unmarshal(b); err != nil {
			return nil, true, fmt.Errorf("%w: to %s: %v", ErrMaybeDelivered, addr, err)
		}
		return resp, true, nil
	case <-ctx.Done():
		return nil, true, fmt.Errorf("transport: call to %s timed out (%w): %w", addr, ErrMaybeDelivered, context.Cause(ctx))
	}
}

// connect returns the peer at addr, waiting at most ConnectTimeout (and
// ctx, and while route is current) for it to become reachable.
func (t *Inmem) connect(ctx context.Context, addr string, route Route) (*Inmem, error) {
	if peer, ok := t.n.route(t.addr, addr); ok {
		return peer, nil
	}
	rctx, stop := whileCurrent(ctx, route)
	defer stop()
	wctx, cancel := context.WithTimeout(rctx, t.n.ConnectTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return nil, fmt.Errorf("%w: %s unreachable when the context ended: %w", ErrNotSent, addr, ctxErr(ctx))
			}
			if rctx.Err() != nil {
				return nil, fmt.Errorf("%w: %w: %s unreachable", ErrNotSent, ErrRouteChanged, addr)
			}
			return nil, fmt.Errorf("%w: %s unreachable for %v (ConnectTimeout)", ErrNotSent, addr, t.n.ConnectTimeout)
		case <-tick.C:
			if peer, ok := t.n.route(t.addr, addr); ok {
				return peer, nil
			}
		}
	}
}

// receive starts answering an encoded request on a goroutine of t; the
// answer arrives on the returned channel (closed if t closes abruptly
// first). ok is false when t no longer takes deliveries.
func (t *Inmem) receive(ctx context.Context, b []byte) (answer chan []byte, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopping || t.h == nil {
		return nil, false
	}
	// The receiver's context ends with the caller's deadline, like a
	// frame's timeout on the wire, never with the caller's cancellation.
	dl, _ := ctx.Deadline()
	rctx, cancel := context.WithDeadline(context.Background(), dl)
	t.nextID++
	id := t.nextID
	c := &inmemCall{answer: make(chan []byte, 1), cancel: cancel}
	t.calls[id] = c
	h := t.h
	t.wg.Go(func() {
		defer cancel()
		lost, latency := t.n.answersLost(t.addr)
		sleep(rctx, latency) // the request travels
		req := new(DeliverRequest)
		var resp *DeliverResponse
		written := func() {}
		if err := req.Unmarshal(b); err != nil {
			resp = &DeliverResponse{Code: CodeBadRequest, Message: err.Error()}
		} else {
			resp, written = h.Deliver(rctx, req)
		}
		enc := resp.Marshal()
		written()
		sleep(rctx, latency) // the answer travels
		t.mu.Lock()
		_, still := t.calls[id] // else Close dropped the connection first
		delete(t.calls, id)
		t.mu.Unlock()
		if still && !lost {
			c.answer <- enc // buffered: never blocks
		}
	})
	return c.answer, true
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
	case <-ctx.Done():
	}
}

// Hot implements Transport.
func (t *Inmem) Hot(ctx context.Context, addr string, shard uint32, limit int) ([]EntityRef, error) {
	peer, err := t.connect(ctx, addr, nil)
	if err != nil {
		return nil, fmt.Errorf("transport: hot entities of shard %d from %s: %w", shard, addr, err)
	}
	peer.mu.Lock()
	h, stopping := peer.h, peer.stopping
	peer.mu.Unlock()
	if h == nil || stopping {
		return nil, fmt.Errorf("transport: hot entities of shard %d from %s: %w", shard, addr, ErrNotSent)
	}
	return slices.Clone(h.Hot(shard, limit)), nil
}

// Forget implements Transport (an Inmem holds nothing per peer).
func (t *Inmem) Forget(map[string]bool) {}

// Close implements Transport: no new delivery is taken; those in flight
// get until grace to answer, then their contexts are cancelled and their
// callers told the connection dropped. It waits for every delivery
// goroutine.
func (t *Inmem) Close(grace time.Duration) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.stopping = true
	t.mu.Unlock()
	t.n.mu.Lock()
	if t.n.nodes[t.addr] == t {
		delete(t.n.nodes, t.addr)
	}
	t.n.mu.Unlock()
	done := make(chan struct{})
	go func() { t.wg.Wait(); close(done) }()
	if grace > 0 {
		tm := time.NewTimer(grace)
		select {
		case <-done:
		case <-tm.C:
		}
		tm.Stop()
	}
	t.mu.Lock()
	t.closed = true
	calls := t.calls
	t.calls = map[uint64]*inmemCall{}
	t.mu.Unlock()
	for _, c := range calls {
		c.cancel() // the handler sees its context end
		close(c.answer)
	}
	<-done
}
