package handoff

import (
	"errors"

	"github.com/shardhost/shardhost/storage"
)

// DefiniteTransfer reports whether a transfer's error (nil included)
// settles whether the lock moved: nil (it moved), or a refusal the store
// is sure of (no such handoff record, the lease or lock is not ours, a
// bad request). Anything else (a timeout, a lost connection) leaves the
// outcome unknown.
func DefiniteTransfer(err error) bool {
	return err == nil || errors.Is(err, storage.ErrNoHandoff) || errors.Is(err, storage.ErrLeaseNotFound) ||
		errors.Is(err, storage.ErrNotOwner) || errors.Is(err, storage.ErrInvalidArgument)
}

// Transfer is what became of one shard's lock transfer (the outbound
// side's cutover).
type Transfer struct {
	Moved, Definite bool
	Epoch           storage.Epoch // the new owner's, when known
	Err             error         // the transfer call's error for this shard
}

// TransferOf returns the outcome of a transfer call that reported err
// (and, if it moved, the new owner's epoch) for one shard.
func TransferOf(err error, epoch storage.Epoch) Transfer {
	return Transfer{Moved: err == nil, Definite: DefiniteTransfer(err), Epoch: epoch, Err: err}
}

// Verdict is what the old owner does with a shard after its transfer.
type Verdict uint8

const (
	// Moved: the lock moved; the shard is disowned here (cutover).
	Moved Verdict = iota
	// Lost: the lock is not ours any more (ErrNotOwner); the shard is
	// never served here again (as a lock lost behind our back).
	Lost
	// Unknown: the outcome stayed unknown and the store unreachable; the
	// shard is dropped (aborted; the lock, if it survived, is released by
	// the orphan safety net).
	Unknown
	// Reopen: the lock is still ours at our epoch; the shard serves again
	// here (aborted).
	Reopen
)

// String returns "moved", "lost", "unknown" or "reopen".
func (v Verdict) String() string {
	return [...]string{"moved", "lost", "unknown", "reopen"}[v]
}

// Verdict returns what to do with the shard after the transfer t.
func (t Transfer) Verdict() Verdict {
	switch {
	case t.Moved:
		return Moved
	case errors.Is(t.Err, storage.ErrNotOwner):
		return Lost
	case !t.Definite:
		return Unknown
	default:
		return Reopen
	}
}
