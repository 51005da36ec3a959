package runner

import (
	"testing"

	"github.com/shardhost/shardhost/internal/machinetest"
)

// name is a state in the notation of lifeTable: the phase's initial (N
// new, C closed, S starting, A attached, D detached, R the stopping
// phase, X stopped), then .d when draining, + in Shutdown's release step.
func (s lifeState) name() string {
	n := string("NCSADRX"[s.phase])
	if s.draining {
		n += ".d"
	}
	if s.stopping {
		n += "+"
	}
	return n
}

// lifeTable is every legal transition from every reachable state: from,
// event, to. Any other event is refused.
const lifeTable = `
N run S;       N close C;     N stop C
C close C;     C stop C
S attach A;    S release S+;  S stop X
S+ release S+; S+ stop X+
A detach D;    A drain A.d;   A release R+;   A stop X
A.d detach D.d; A.d drain A.d; A.d release R.d+; A.d stop X.d
D attach A;    D release D+;  D stop X
D.d attach A.d; D.d release D.d+; D.d stop X.d
D+ release D+; D+ stop X+
D.d+ release D.d+; D.d+ stop X.d+
R+ detach D+;  R+ release R+; R+ stop X+
R.d+ detach D.d+; R.d+ release R.d+; R.d+ stop X.d+
X release X+;  X stop X
X+ release X+; X+ stop X+
X.d release X.d+; X.d stop X.d
X.d+ release X.d+; X.d+ stop X.d+
`

func TestLifecycleAcceptsOnlyItsTransitions(t *testing.T) {
	machinetest.Table(t, machinetest.Machine[lifeState, phaseEvent]{
		Events: numPhaseEvents, Next: lifeState.next, Check: lifeState.check,
		Name: lifeState.name, Event: phaseEvent.String,
	}, lifeTable)
}

func TestLifecycleCheckNamesEachBrokenInvariant(t *testing.T) {
	for _, s := range []lifeState{
		{phase: phaseNew, stopping: true},
		{phase: phaseClosed, draining: true},
		{phase: phaseStopping},
		{phase: phaseAttached, stopping: true},
		{phase: phaseStarting, draining: true},
	} {
		if s.check() == nil {
			t.Errorf("state %s passes check", s.name())
		}
	}
}

// The lifecycle is assigned in toLocked only, outside the tests: one
// writer for the state machine.
func TestOnlyToLockedWritesTheLifecycle(t *testing.T) {
	machinetest.OneWriter(t, ".", "lifecycle", "toLocked")
}
