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
//     keepalive pings, MaxConnections) and what a peer's messages and
//     streams cost (Bounds, below).
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
// once its answer is written (or given up: the connection failed, or the
// peer read nothing for 1-1.5 s, see Bounds), so a receiver can hold a
// shard until every answer of it is on its way.
//
// A call waiting for a connection gives way to a routing change: both
// implementations are RouteCallers, and CallRoute abandons the wait — a
// dial that hangs (a black-holed host) or retries (a refused port) —
// as soon as the sender's Route for the call is no longer current,
// reporting ErrNotSent and ErrRouteChanged (nothing sent). A call already
// sent is never abandoned that way: it ends with its answer, its
// connection or its context, so its at-most-once report stays exact.
//
// # Bounds
//
// What a peer can make a GRPC transport's server hold, whatever it sends
// (limit is GRPCConfig.MaxMessageSize):
//
//   - Messages: at most limit + 64 KiB on every RPC, both ways (a payload
//     of limit with its strings, headers and framing); a larger one fails
//     its RPC — on a delivery stream, every call in flight on it — so the
//     runners of a cluster share one MaxMessageSize.
//   - Decoding: at most 72 bytes allocated per byte received, plus 1 KiB
//     per message; counts are checked before anything is allocated for
//     them (a batch holds at most 512 frames, twice what a sender puts in
//     one; a Hot answer 4096 entities; a request keeps 32 headers of
//     16 KiB in all), a field repeated is allocated once (the last kept),
//     and a frame that carries nothing costs nothing. A message over a
//     count is malformed: its RPC ends with an error saying so. The fuzz
//     targets check the bound.
//   - RPCs: at most 32 open at once per connection (HTTP/2 concurrent
//     streams); a runner's further calls wait for a slot (one that needs a
//     new delivery stream at most ConnectTimeout, then it is not sent), a
//     peer's further streams are refused.
//   - Delivery streams (rpc Frames and rpc Stream): those of one connection
//     hold at most 4096 requests whose answers are not handed to gRPC yet
//     (handlers running, answers queued) and max(16 MiB, 4 × (limit +
//     64 KiB)) of their bytes. Past either, they stop reading: the peer's
//     further frames wait in the HTTP/2 stream window (4 MiB), then in the
//     peer. Their goroutines: at most 4096 workers per connection (one
//     per handler running; at most 16 idle per stream) and 3 per stream.
//   - Answers a peer does not read wait behind its HTTP/2 window (and 64
//     KiB per stream in gRPC); once a send has waited 1 s (1.5 s at most),
//     their written callbacks are called as given up, so the drains of
//     the receiving runner's shards do not wait for that peer. They are
//     still sent if it reads again.
//
// A connection thus holds at most about 64 × (limit + 64 KiB) in RPCs and
// windows, plus its delivery streams' bytes above (≈ 280 MiB at the
// defaults, most of it only with messages of the maximum size), and
// MaxConnections bounds the connections. A peer shares nothing with
// other peers' connections but the process's CPU and memory: its unread
// answers delay no one else's, and its requests wait for no one else's.
//
// # Concurrency
//
// Transports are safe for concurrent use. A transport's goroutines are
// owned by it: Close waits for all of them.
package transport
