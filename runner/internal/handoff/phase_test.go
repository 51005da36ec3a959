package handoff

import (
	"errors"
	"fmt"
	"testing"
)

var allPhases = []Phase{Planned, Warming, Ready, Drained, Cutover, Aborted, Acquired}

// legal is the protocol's transition table, written out: every transition
// not listed here must be refused.
var legal = map[Side]map[Phase][]Phase{
	NewOwner: {
		Planned: {Warming, Cutover, Aborted, Acquired},
		Warming: {Ready, Cutover, Aborted, Acquired},
		Ready:   {Cutover, Aborted, Acquired},
	},
	OldOwner: {
		Planned: {Drained, Aborted},
		Drained: {Cutover, Aborted},
	},
}

func isLegal(s Side, from, to Phase) bool {
	for _, p := range legal[s][from] {
		if p == to {
			return true
		}
	}
	return false
}

// TestNextAllowsExactlyTheProtocolsTransitions: for each side, every
// transition of the protocol is allowed and every other one (7 x 7 pairs
// per side) is refused, leaving the phase where it was; a refusal from an
// ended handoff is ErrEnded (a late report), any other ErrIllegal.
func TestNextAllowsExactlyTheProtocolsTransitions(t *testing.T) {
	for _, s := range []Side{NewOwner, OldOwner} {
		n := 0
		for _, from := range allPhases {
			for _, to := range allPhases {
				got, err := Next(s, from, to)
				if isLegal(s, from, to) {
					n++
					if err != nil || got != to {
						t.Errorf("Next(%v, %v, %v) = %v, %v; want %v, nil", s, from, to, got, err, to)
					}
					continue
				}
				var te *TransitionError
				if err == nil || got != from || !errors.As(err, &te) || te.Side != s || te.From != from || te.To != to {
					t.Errorf("Next(%v, %v, %v) = %v, %v; want %v and a *TransitionError", s, from, to, got, err, from)
					continue
				}
				if ended := errors.Is(err, ErrEnded); ended != from.Ended() || errors.Is(err, ErrIllegal) == ended {
					t.Errorf("Next(%v, %v, %v): %v; want ErrEnded %v, ErrIllegal %v", s, from, to, err, from.Ended(), !from.Ended())
				}
			}
		}
		want := 0
		for _, tos := range legal[s] {
			want += len(tos)
		}
		if n != want {
			t.Errorf("%v: %d legal transitions, want %d", s, n, want)
		}
	}
}

// TestHandoffPathsOfTheProtocol: the paths DESIGN.md describes run through
// the machine of each side from Planned to their end.
func TestHandoffPathsOfTheProtocol(t *testing.T) {
	for _, tc := range []struct {
		side Side
		path []Phase
	}{
		{NewOwner, []Phase{Warming, Ready, Cutover}},  // a planned move
		{NewOwner, []Phase{Warming, Aborted}},         // reassigned while warming
		{NewOwner, []Phase{Aborted}},                  // the warming record could not be written
		{NewOwner, []Phase{Warming, Ready, Acquired}}, // the old owner died: the lock is acquired
		{OldOwner, []Phase{Drained, Cutover}},         // a planned move
		{OldOwner, []Phase{Aborted}},                  // handlers still running after the drain
		{OldOwner, []Phase{Drained, Aborted}},         // the transfer failed
	} {
		m := NewMachine(tc.side)
		for _, p := range tc.path {
			if err := m.Advance(p); err != nil {
				t.Errorf("%v path %v: %v", tc.side, tc.path, err)
			}
		}
		if last := tc.path[len(tc.path)-1]; m.Phase() != last || !last.Ended() {
			t.Errorf("%v path %v ends in %v", tc.side, tc.path, m.Phase())
		}
	}
}

// TestOneEndPerHandoff: once a handoff ended, nothing moves it — not a
// second end, not a progress phase — on either side.
func TestOneEndPerHandoff(t *testing.T) {
	for _, s := range []Side{NewOwner, OldOwner} {
		for _, end := range []Phase{Cutover, Aborted, Acquired} {
			m := NewMachine(s)
			if s == OldOwner && end == Cutover {
				_ = m.Advance(Drained)
			}
			if err := m.Advance(end); err != nil {
				if s == OldOwner && end == Acquired {
					continue // not an end of the old owner's
				}
				t.Fatalf("%v: %v: %v", s, end, err)
			}
			for _, p := range allPhases {
				if err := m.Advance(p); !errors.Is(err, ErrEnded) || m.Phase() != end {
					t.Errorf("%v ended %v, then %v: %v, phase %v; want ErrEnded, %v", s, end, p, err, m.Phase(), end)
				}
			}
		}
	}
}

// TestPhaseNames: the names of the reported phases (those of runner's
// Phase* constants), and of the rest.
func TestPhaseNames(t *testing.T) {
	want := []string{"planned", "warming", "ready", "drained", "cutover", "aborted", "acquired"}
	for i, p := range allPhases {
		if p.String() != want[i] {
			t.Errorf("Phase(%d).String() = %q, want %q", p, p.String(), want[i])
		}
	}
	if s := Phase(99).String(); s != "Phase(99)" {
		t.Errorf("Phase(99).String() = %q", s)
	}
	err := &TransitionError{Side: OldOwner, From: Planned, To: Cutover}
	if got, want := err.Error(), fmt.Sprintf("%v: outbound handoff planned -> cutover", ErrIllegal); got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
