package handoff

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/storage"
)

// Inbound is one handoff the new owner runs: the takeover of a shard from
// its live owner, from the decision to its end. Its context ends when the
// handoff ends (Advance to Cutover, Aborted or Acquired).
type Inbound struct {
	from      storage.Runner
	fromEpoch storage.Epoch
	started   time.Time
	ctx       context.Context
	cancel    context.CancelFunc

	mu     sync.Mutex
	m      Machine
	warmed map[hosting.EntityKey]any // warmed, not yet activated instances; nil once taken
}

// NewInbound returns a takeover, in phase Planned, of a shard whose lock
// runner from holds at epoch fromEpoch, decided at now. Its context is a
// child of parent (the runner's attachment).
func NewInbound(parent context.Context, from storage.Runner, fromEpoch storage.Epoch, now time.Time) *Inbound {
	ctx, cancel := context.WithCancel(parent)
	return &Inbound{
		from: from, fromEpoch: fromEpoch, started: now, ctx: ctx, cancel: cancel,
		m: NewMachine(NewOwner), warmed: map[hosting.EntityKey]any{},
	}
}

// From returns the old owner the shard is taken from.
func (in *Inbound) From() storage.Runner { return in.from }

// FromEpoch returns the epoch of the old owner's lock the takeover is for
// (the old owner cuts over only to a record naming it).
func (in *Inbound) FromEpoch() storage.Epoch { return in.fromEpoch }

// Started returns when the takeover was decided.
func (in *Inbound) Started() time.Time { return in.started }

// Context returns the takeover's context, cancelled when it ends.
func (in *Inbound) Context() context.Context { return in.ctx }

// Phase returns the takeover's phase.
func (in *Inbound) Phase() Phase {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.m.Phase()
}

// Advance moves the takeover to phase to (see Next), cancelling its
// context if to ends it. If the transition is legal and report is not
// nil, report runs before Advance returns, under the takeover's lock, so
// the reports of one takeover are never reordered (report must not call
// the takeover's methods). Otherwise the phase is unchanged, report is not
// called, and the *TransitionError says why (ErrEnded: a late report).
// An ended takeover's context is already cancelled, so an abort refused
// as late (ErrEnded) still leaves it cancelled.
func (in *Inbound) Advance(to Phase, report func()) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if err := in.m.Advance(to); err != nil {
		return err
	}
	if to.Ended() {
		in.cancel()
	}
	if report != nil {
		report()
	}
	return nil
}

// Warmed keeps a warmed instance of the entity key, to activate on the
// new owner. Once the instances were taken (TakeWarmed), late ones are
// dropped.
func (in *Inbound) Warmed(key hosting.EntityKey, inst any) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.warmed != nil {
		in.warmed[key] = inst
	}
}

// TakeWarmed hands the warmed instances over (once; nil after that).
func (in *Inbound) TakeWarmed() map[hosting.EntityKey]any {
	in.mu.Lock()
	defer in.mu.Unlock()
	w := in.warmed
	in.warmed = nil
	return w
}

// Restart reports whether the takeover must start over now that the
// shard's lock is l, held by the live runner holder, and why: the shard
// changed hands while it warmed, or its owner rewrote the lock (a
// re-attachment under the same lease gives new epochs, and the old owner
// cuts over only to a record naming its epoch). The record of a new
// takeover overwrites this one's.
func (in *Inbound) Restart(l storage.Lock, holder string) (why string, restart bool) {
	switch {
	case in.from.Lease != l.Lease:
		return "the old owner changed to " + holder, true
	case in.fromEpoch != l.Epoch:
		return fmt.Sprintf("the old owner rewrote its lock (epoch %d, was %d)", l.Epoch, in.fromEpoch), true
	}
	return "", false
}
