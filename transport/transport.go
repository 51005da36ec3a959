package transport

import (
	"context"
	"errors"
	"time"
)

// Errors of delivery. A Call's error says whether its request may have
// reached a handler: ErrNotSent never did (safe to retry), ErrMaybeDelivered
// may have (never retried by the runtime).
var (
	// ErrMessageTooLarge: a request or response exceeds the size limit. A
	// too-large request is never sent.
	ErrMessageTooLarge = errors.New("transport: message too large")
	// ErrMaybeDelivered: the connection to the owner failed after the
	// message was sent, or the caller's context ended while it waited for
	// the answer: the handler may or may not have run.
	ErrMaybeDelivered = errors.New("transport: message may have been delivered")
	// ErrNotSent: the owner could not be reached before sending (no
	// connection, or one that is closing).
	ErrNotSent = errors.New("transport: owner unreachable; message not sent")
	// ErrClosed: the transport was closed.
	ErrClosed = errors.New("transport: closed")
	// ErrRouteChanged: a call gave up waiting for a connection because its
	// Route stopped being current (its errors match ErrNotSent too).
	ErrRouteChanged = errors.New("transport: route changed while connecting")
)

// Route is the sender's routing decision a call was made under (see
// RouteCaller): the destination stays right while Current reports true.
// Both methods are called from the goroutine of a call waiting for a
// connection, concurrently with anything else.
type Route interface {
	// Changed returns a channel closed at the sender's next routing change.
	Changed() <-chan struct{}
	// Current reports whether the sender would still send the call to the
	// address it was made to.
	Current() bool
}

// RouteCaller is implemented by transports whose Call may wait for a
// connection before sending (GRPC, Inmem): the sender's routing passes the
// Route of each call, so that a call waiting for a runner that is gone (a
// dial that hangs or is refused) gives way at once when the shard's route
// moves elsewhere, instead of after ConnectTimeout.
type RouteCaller interface {
	// CallRoute is Call, except that while it waits for a connection to
	// addr — before anything is sent — it also gives up as soon as route
	// is not Current (checked at the start and at every Changed): then
	// sent is false and the error matches ErrNotSent and ErrRouteChanged.
	// Once the request is sent, route is no longer consulted: a call in
	// flight ends only with its answer, its connection or ctx. A nil route
	// is Call. CallRoute keeps no reference to route once it returns.
	CallRoute(ctx context.Context, addr string, req *DeliverRequest, route Route) (resp *DeliverResponse, sent bool, err error)
}

// whileCurrent returns a context derived from ctx that ends, with cause
// ErrRouteChanged, as soon as route is not Current, and a stop function
// that must be called (it waits for the goroutine watching route). A nil
// route: ctx itself.
func whileCurrent(ctx context.Context, route Route) (context.Context, func()) {
	if route == nil {
		return ctx, func() {}
	}
	wctx, cancel := context.WithCancelCause(ctx)
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		for {
			changed := route.Changed() // before Current: no change is missed
			if !route.Current() {
				cancel(ErrRouteChanged)
				return
			}
			select {
			case <-changed:
			case <-wctx.Done():
				return
			}
		}
	}()
	return wctx, func() { cancel(nil); <-exited }
}

// Handler answers the deliveries a Transport receives: the receiving
// runner. Its methods are called concurrently.
type Handler interface {
	// Deliver answers req. ctx ends with the caller's deadline (or the
	// connection). written is called once the answer is written to the
	// connection (or given up): the receiving runner counts the answers
	// not written yet, so that a shard does not move while one of its
	// answers is in flight. resp is best req.NewResponse(), filled in.
	// req's strings and payload may share the memory of the message it
	// arrived in when that was at most 1 KiB (never written to): what
	// outlives the answer keeps all of it alive, so keep a copy
	// (strings.Clone) of what is kept.
	Deliver(ctx context.Context, req *DeliverRequest) (resp *DeliverResponse, written func())
	// Hot lists up to limit entities of shard, most recently used first
	// (the new owner of a handoff warms them).
	Hot(shard uint32, limit int) []EntityRef
}

// Transport carries deliveries between runners. Implementations: GRPC
// (production: gRPC over TCP, optional mutual TLS) and Inmem (tests and the
// deterministic simulation: function calls between transports of one
// InmemNetwork). Methods are safe for concurrent use.
type Transport interface {
	// Listen starts answering deliveries with h and returns the address
	// peers reach this transport at ("" when it serves nothing: a
	// client-only runner). Call it at most once.
	Listen(h Handler) (addr string, err error)
	// Call delivers req to the runner at addr and waits for its answer,
	// bounded by ctx (or, without a deadline, by the transport's request
	// timeout). sent is false when req certainly reached no handler; the
	// error then matches ErrNotSent, ErrMessageTooLarge or ErrClosed.
	Call(ctx context.Context, addr string, req *DeliverRequest) (resp *DeliverResponse, sent bool, err error)
	// Hot asks the runner at addr for its hot entities of shard.
	Hot(ctx context.Context, addr string, shard uint32, limit int) ([]EntityRef, error)
	// Forget releases what is held for peers whose address is not in live,
	// once calls in flight to them had time to end.
	Forget(live map[string]bool)
	// Close stops answering (gracefully within grace: answers in flight
	// are written, callers are told to go away; abruptly after it or with
	// grace 0, like a crash) and closes connections to peers. It waits
	// for every goroutine the transport started. Idempotent.
	Close(grace time.Duration)
}
