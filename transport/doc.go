// Package transport carries messages between the runners of a shardhost
// cluster: a sending runner delivers one message to the owner of its
// shard and waits for the answer; the receiving runner answers it (a
// Handler). The package holds the wire messages (transport.proto, encoded
// by hand with protowire), the small Transport interface the runner
// depends on, and its two implementations, side by side as in
// hashicorp/raft:
//
//   - GRPC, the production transport: gRPC over TCP with optional mutual
//     TLS; each runner keeps connsPerPeer connections to a peer, each with
//     one long-lived multiplexed stream (unary calls for payloads over
//     64 KiB) on which both sides coalesce frames: a lone frame is sent at
//     once, frames that queue up while others are being sent go out
//     together, never held back by a timer (mux.go); the server bounds
//     what a connection costs (5 s handshake deadline, 5 min idle limit,
//     keepalive pings, MaxConnections).
//     Handshakes refused by TLS (no certificate, one of another CA) or by
//     GRPCConfig.VerifyPeer (the runner's Config.RequireClusterPeers) are
//     logged at WARN with the peer's address and the reason, at most once
//     a minute each way.
//   - Inmem, transports of one InmemNetwork in one process: deliveries are
//     function calls on goroutines, with the same encoding, and faults
//     (unreachable addresses, lost answers, latency) can be injected. It
//     uses only goroutines, channels and timers, so whole clusters run
//     inside testing/synctest.
//
// # Guarantees
//
// At most once: a Call either reports that its request certainly reached
// no handler (sent false: ErrNotSent, ErrMessageTooLarge, ErrClosed; the
// runtime retries) or that it may have (ErrMaybeDelivered: the connection
// failed after sending, or the caller's context ended while waiting; never
// retried). A receiver's context ends with the caller's deadline, never
// with the caller's cancellation. Handler.Deliver's written callback runs
// once its answer is written (or given up), so a receiver can hold a shard
// until every answer of it is on its way.
//
// A call waiting for a connection gives way to a routing change: both
// implementations are RouteCallers, and CallRoute abandons the wait — a
// dial that hangs (a black-holed host) or retries (a refused port) —
// as soon as the sender's Route for the call is no longer current,
// reporting ErrNotSent and ErrRouteChanged (nothing sent). A call already
// sent is never abandoned that way: it ends with its answer, its
// connection or its context, so its at-most-once report stays exact.
//
// # Concurrency
//
// Transports are safe for concurrent use. A transport's goroutines are
// owned by it: Close waits for all of them.
package transport
