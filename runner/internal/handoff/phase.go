package handoff

import (
	"errors"
	"fmt"
)

// Side is the side of a handoff a runner is on.
type Side uint8

const (
	// NewOwner is the inbound side: it records warming, warms, records
	// ready, and receives the lock.
	NewOwner Side = iota + 1
	// OldOwner is the outbound side: it sees ready, drains and moves the
	// lock.
	OldOwner
)

// String returns "inbound" (NewOwner) or "outbound" (OldOwner).
func (s Side) String() string {
	switch s {
	case NewOwner:
		return "inbound"
	case OldOwner:
		return "outbound"
	}
	return fmt.Sprintf("Side(%d)", uint8(s))
}

// Phase is the phase of one handoff on one side.
type Phase uint8

const (
	// Planned: the move was decided and nothing was reported yet (inbound:
	// no record written; outbound: admission stopping, draining). Every
	// handoff starts here; it is never reported.
	Planned Phase = iota
	// Warming: the new owner wrote the handoff record and warms.
	Warming
	// Ready: the new owner finished warming (or gave up waiting) and
	// records ready.
	Ready
	// Drained: the old owner stopped admitting, drained and released its
	// entities, and ran ReleaseShard.
	Drained
	// Cutover: the lock moved to the new owner (reported by both sides).
	Cutover
	// Aborted: the handoff was abandoned; the old owner keeps or plainly
	// releases the shard.
	Aborted
	// Acquired: the new owner acquired the shard's lock directly (the old
	// owner died mid-handoff, its lock expired). It ends an inbound
	// handoff without a phase report of its own (the acquisition is).
	Acquired
)

var phaseNames = [...]string{"planned", "warming", "ready", "drained", "cutover", "aborted", "acquired"}

// String returns the phase's name: for Warming to Aborted, the name
// package runner reports in HandoffPhase events (runner.PhaseWarming...).
func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("Phase(%d)", uint8(p))
}

// Ended reports whether p ends a handoff.
func (p Phase) Ended() bool { return p == Cutover || p == Aborted || p == Acquired }

// Errors of a refused transition (see TransitionError).
var (
	// ErrEnded: the handoff already ended; the report came late (a
	// concurrent end came first). Not a bug: the report is dropped.
	ErrEnded = errors.New("handoff: already ended")
	// ErrIllegal: the transition is not in the protocol. A bug: the phase
	// is not changed.
	ErrIllegal = errors.New("handoff: illegal phase transition")
)

// TransitionError is a transition Next refused. It matches ErrEnded or
// ErrIllegal with errors.Is.
type TransitionError struct {
	Side     Side
	From, To Phase
}

// Error names the side and the refused transition.
func (e *TransitionError) Error() string {
	return fmt.Sprintf("%v: %s handoff %v -> %v", e.Unwrap(), e.Side, e.From, e.To)
}

// Unwrap returns ErrEnded when the handoff had ended, else ErrIllegal.
func (e *TransitionError) Unwrap() error {
	if e.From.Ended() {
		return ErrEnded
	}
	return ErrIllegal
}

// Next returns the phase a handoff on side s is in after moving from
// phase from to phase to, or a *TransitionError (from unchanged) if the
// protocol does not allow it. It is the protocol's one transition
// function. Its invariants:
//
//   - An ended handoff (Cutover, Aborted, Acquired) stays ended: it ends
//     once and reports nothing after that.
//   - No phase repeats and nothing goes back to Planned.
//   - NewOwner: Planned → Warming → Ready, in that order (ready follows a
//     written warming record). It ends Aborted, Cutover or Acquired from
//     any live phase: the lock is a fact that can reach the new owner
//     before it reported ready (a transfer on an earlier takeover's ready
//     record, the old owner's death). Never Drained.
//   - OldOwner: Planned → Drained → Cutover: the lock moves only after
//     the drain. Aborted from Planned (handlers still running after the
//     drain) or Drained (the transfer failed or its outcome is unknown).
//     Never Warming, Ready or Acquired.
func Next(s Side, from, to Phase) (Phase, error) {
	ok := false // every transition not listed: an ended or absent phase allows none
	switch s {
	case NewOwner:
		switch to {
		case Warming:
			ok = from == Planned
		case Ready:
			ok = from == Warming
		case Cutover, Aborted, Acquired:
			ok = from == Planned || from == Warming || from == Ready
		}
	case OldOwner:
		switch to {
		case Drained:
			ok = from == Planned
		case Cutover:
			ok = from == Drained
		case Aborted:
			ok = from == Planned || from == Drained
		}
	}
	if !ok {
		return from, &TransitionError{Side: s, From: from, To: to}
	}
	return to, nil
}

// Machine is one handoff's phase on one side. The zero value is not
// usable; a Machine is not safe for concurrent use (see Inbound for a
// guarded one).
type Machine struct {
	side  Side
	phase Phase
}

// NewMachine returns a handoff on side s in phase Planned.
func NewMachine(s Side) Machine { return Machine{side: s} }

// Phase returns the current phase.
func (m *Machine) Phase() Phase { return m.phase }

// Advance moves the handoff to phase to, or returns Next's error and
// leaves it where it was.
func (m *Machine) Advance(to Phase) error {
	p, err := Next(m.side, m.phase, to)
	m.phase = p
	return err
}
