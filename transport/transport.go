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
)

// Handler answers the deliveries a Transport receives: the receiving
// runner. Its methods are called concurrently.
type Handler interface {
	// Deliver answers req. ctx ends with the caller's deadline (or the
	// connection). written is called once the answer is written to the
	// connection (or given up): the receiving runner counts the answers
	// not written yet, so that a shard does not move while one of its
	// answers is in flight.
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
