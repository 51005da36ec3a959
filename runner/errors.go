package runner

import (
	"errors"
	"fmt"

	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/registration"
	"github.com/shardhost/shardhost/runner/internal/routing"
	"github.com/shardhost/shardhost/transport"
)

// Sentinel errors. The cause errors (ErrDetached, ErrShardMoved,
// ErrPassivated, ErrShutdown, ErrCallerDeadline) are what context.Cause
// returns for the context of a shard or entity handler that was
// interrupted.
var (
	// ErrDetached: the runner detached from the cluster (lease deadline,
	// storage failure, lost lock) and stopped every entity.
	ErrDetached = hosting.ErrDetached
	// ErrShardMoved: the shard is no longer owned here (released or taken).
	ErrShardMoved = hosting.ErrShardMoved
	// ErrPassivated: the entity was stopped while its shard stays here,
	// for one of two reasons that both match it with errors.Is:
	// ErrIdleExpired or ErrEvicted (the Reason of entity.ReleaseInfo).
	ErrPassivated = hosting.ErrPassivated
	// ErrIdleExpired: the entity received no message for its kind's
	// IdleAfter (errors.Is(err, ErrPassivated) holds). An entity whose
	// state ends with disuse (a session) may delete its checkpoint on
	// this reason, and only on this one (see the Release example).
	ErrIdleExpired = hosting.ErrIdleExpired
	// ErrEvicted: the entity was the least recently used idle one while
	// the runner held more than MaxResidentEntities (errors.Is(err,
	// ErrPassivated) holds): memory pressure, not disuse, so its state is
	// still wanted — checkpoint it, never delete it.
	ErrEvicted = hosting.ErrEvicted
	// ErrShutdown: the runner is shutting down.
	ErrShutdown = hosting.ErrShutdown
	// ErrCallerDeadline: the asker's deadline passed while its handler ran
	// (the cause of the handler's context; the asker has given up).
	ErrCallerDeadline = hosting.ErrCallerDeadline
	// ErrClosed: the runner is not running: Run returned (Shutdown,
	// Close, its context ended) or was never called. A send to a runner
	// that stopped fails with it at once; a send made before Run was
	// called waits up to one second for the call (so `go r.Run(ctx)`
	// followed by a send works), then fails with it.
	ErrClosed = errors.New("runner: closed")
	// ErrInvalidConfig: the configuration cannot work.
	ErrInvalidConfig = errors.New("runner: invalid config")
	// ErrAlreadyRunning: Run was called twice.
	ErrAlreadyRunning = errors.New("runner: already running")
	// ErrDuplicateRunnerID: another live process registered this runner's
	// ID (Config.ID); Run returns it after giving the ID up.
	ErrDuplicateRunnerID = registration.ErrDuplicateRunnerID
	// ErrClusterMismatch: the runner's configuration disagrees with the
	// cluster record (see *ClusterMismatchError); Run returns it.
	ErrClusterMismatch = registration.ErrClusterMismatch
	// ErrNoTransport: a shard's owner serves no transport (a hosting runner
	// without ListenAddr/Address), so its entities cannot be reached from
	// another runner; Run of such a runner returns it as soon as the
	// cluster holds a runner of another process.
	ErrNoTransport = routing.ErrNoTransport
	// ErrStartTimeout: Run was not ready within Config.StartTimeout.
	ErrStartTimeout = errors.New("runner: not ready within StartTimeout")
	// ErrTooManyAsyncSends: Config.MaxAsyncSends sends of SendAsync are in
	// flight; the send was refused (not sent).
	ErrTooManyAsyncSends = errors.New("runner: too many asynchronous sends in flight")
	// ErrNoOwner: no owner of the shard is known (yet); the error says why
	// (the cluster not listed, no runner registered, the shard unowned for
	// how long). Send retries it until its context ends.
	ErrNoOwner = routing.ErrNoOwner
)

// ClusterMismatchError reports a setting of this runner that differs from
// the one the cluster record holds (Config.NumShards, Config.Strategy).
// Every runner of a cluster must agree on them: Run fails with it at start
// (and so do sends, which would otherwise wait for owners that never
// come). Its fields: Setting ("NumShards" or "Strategy"), Cluster (the
// cluster's value), Runner (this runner's value) and WrittenBy (the runner
// that published the cluster's value, "" if unknown); errors.Is(err,
// ErrClusterMismatch) holds.
type ClusterMismatchError = registration.ClusterMismatchError

// InsecureTransportError reports a runner whose transport would listen
// beyond loopback (ListenAddr) without TLS while
// Config.AllowInsecureTransport is not set: whoever reaches the port could
// call any method of any entity. New returns it; errors.Is(err,
// ErrInvalidConfig) holds. The fix: Config.TLS and Config.PeerTLS (mutual
// TLS, see SECURITY.md), a loopback ListenAddr, or, on a network trusted
// as such, AllowInsecureTransport.
type InsecureTransportError struct {
	ListenAddr string
}

func (e *InsecureTransportError) Error() string {
	return fmt.Sprintf("runner: invalid config: the transport would listen on %q, beyond loopback, without TLS "+
		"(anyone reaching it could call any method of any entity): set Config.TLS and Config.PeerTLS (mutual TLS, see SECURITY.md), "+
		"listen on loopback (127.0.0.1:PORT), or set Config.AllowInsecureTransport on a network you trust", e.ListenAddr)
}

// Unwrap returns ErrInvalidConfig.
func (e *InsecureTransportError) Unwrap() error { return ErrInvalidConfig }

// NotOwnerError reports that this runner does not own Shard at its current
// epoch. It is retryable: the message was not delivered. Its fields: Shard,
// and OwnerHint, the runner believed to own it ("" when unknown or
// unowned).
type NotOwnerError = hosting.NotOwnerError

// UndeliveredError reports a message that never reached a handler: it was
// queued for a shard that left this runner before the message ran. Like
// NotOwnerError it is safe to retry. Its fields: Shard, and Cause —
// ErrDetached, ErrShardMoved or ErrShutdown, or the context's error when
// it ended before the message was admitted or run (Unwrap returns it).
type UndeliveredError = hosting.UndeliveredError

// StaleResultError reports a handler that ran but whose result is withheld:
// the runner it ran on lost the shard while it ran (the detach instant
// passed, or the shard was taken, dropped or detached), or, when the reply
// arrived, the sender had already seen a newer epoch of the shard (through
// its lock watch or an earlier reply) and the owner's lease had ended. The
// handler's effects may exist — in the old owner's memory, never in fenced
// storage — so errors.Is(err, ErrMaybeDelivered) holds and the call is not
// retried. Its fields: Shard; Runner, the runner the handler ran on;
// Epoch, the ownership epoch it ran under; Newer, the newer epoch the
// sender had seen (0 when the owner withheld the result itself); Reason;
// and Cause, why the shard left (ErrDetached — also when the detach instant
// passed —, ErrShardMoved or ErrShutdown).
type StaleResultError = hosting.StaleResultError

// Errors of remote delivery (the transport's, under the runner's names).
var (
	// ErrMessageTooLarge: a request or response exceeds MaxMessageSize.
	// A too-large request is never sent.
	ErrMessageTooLarge = transport.ErrMessageTooLarge
	// ErrMaybeDelivered: the connection to the owner failed after the
	// message was sent, or the caller's context ended while it waited;
	// the handler may or may not have run. Not retried.
	ErrMaybeDelivered = transport.ErrMaybeDelivered
	// ErrNotSent: the owner could not be reached before sending (no
	// connection). Retried until the caller's context ends.
	ErrNotSent = transport.ErrNotSent
	// ErrTooManyWaiting: MaxWaitingSends sends already wait for an owner.
	ErrTooManyWaiting = routing.ErrTooManyWaiting
)

// RemoteError is a handler error that came back from another runner: only
// its message survives the wire. Its fields: Runner, the runner the
// handler ran on, and Message.
type RemoteError = routing.RemoteError
