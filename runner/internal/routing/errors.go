package routing

import "errors"

// Errors of routing; package runner re-exports them under the same names.
var (
	// ErrTooManyWaiting: MaxWaitingSends sends already wait for an owner.
	ErrTooManyWaiting = errors.New("runner: too many sends waiting for an owner")
	// ErrNoTransport: a shard's owner serves no transport, so its entities
	// cannot be reached from another runner.
	ErrNoTransport = errors.New("runner: no transport address")
	// ErrNoOwner: no owner of the shard is known (yet); the error says why.
	ErrNoOwner = errors.New("runner: no owner known")
)

// RemoteError is a handler error that came back from another runner: only
// its message survives the wire.
type RemoteError struct {
	Runner  string // the runner the handler ran on
	Message string
}

func (e *RemoteError) Error() string { return e.Message }
