package runner

import "fmt"

// The runner's lifecycle is one state machine, lifeState, changed only by
// toLocked with an event that next accepts (the table of legal
// transitions is TestLifecycleAcceptsOnlyItsTransitions). Callers do not
// guard a transition with a test of their own: they ask next (or
// toLocked, which reports whether it applied) and branch on its answer,
// so a guard and the machine cannot disagree.
//
// The state has two parts. The phase says where the runner is with its
// cluster: new, closed (stopped before Run), starting (Run called, not
// registered yet), attached, detached, stopping (Shutdown releasing the
// shards of an attached runner), stopped. Shutdown's progress is beside
// it, because Shutdown runs across attach and detach: draining (its first
// step: registered with weight 0 so peers take the shards by handoff; an
// attach during it registers as draining again) and stopping (its release
// step began: the runner never attaches again).
//
// Invariants (check):
//
//   - new and closed carry no Shutdown progress; closed is final, and so
//     is stopped but for Shutdown's release step, which may begin after
//     the runner stopped and changes nothing then.
//   - The stopping phase implies Shutdown's release step (stopping).
//   - An attached runner is not in Shutdown's release step: the step
//     moves an attached runner to the stopping phase, and attach refuses
//     once it began.
//   - draining only after Run: the handoff step begins attached.
//
// What the runner keeps beside the machine is not lifecycle: its
// attachment (Runner.att: set by attach, ended by detachLocked), and
// attachedSince, the control loop's.

// phase is where a Runner is with its cluster (lifeState).
type phase uint8

const (
	phaseNew      phase = iota // constructed, Run not called
	phaseClosed                // Shutdown or Close came before Run
	phaseStarting              // Run called, not registered yet
	phaseAttached              // registered, may own shards
	phaseDetached              // detached: owns nothing, probing
	phaseStopping              // Shutdown releasing the shards of an attached runner
	phaseStopped               // Run returned or about to
)

// String is the phase as Status and the debug page show it: a runner
// closed before Run shows as stopped.
func (p phase) String() string {
	return [...]string{"new", "stopped", "starting", "attached", "detached", "stopping", "stopped"}[p]
}

// lifeState is the runner's lifecycle state (see the comment above).
type lifeState struct {
	phase    phase
	draining bool // Shutdown's handoff step: registered as draining
	stopping bool // Shutdown's release step began: never attach again
}

// ran reports whether Run was called.
func (s lifeState) ran() bool { return s.phase != phaseNew && s.phase != phaseClosed }

// phaseEvent is what moves a runner's lifecycle.
type phaseEvent uint8

const (
	onRun     phaseEvent = iota // Run began (begin)
	onClose                     // Shutdown or Close before Run
	onAttach                    // registered under a live lease (attach)
	onDetach                    // the lease is in danger, or lost (detachLocked)
	onDrain                     // Shutdown's handoff step (beginDrainMode)
	onRelease                   // Shutdown's release step (shutdown)
	onStop                      // the runner stops: Run's end, an ended context, Close, a fatal error, a failed listen
	numPhaseEvents
)

func (e phaseEvent) String() string {
	return [...]string{"run", "close", "attach", "detach", "drain", "release", "stop"}[e]
}

// next returns the state ev leads to from s, and false (with s) when s
// does not accept ev.
func (s lifeState) next(ev phaseEvent) (lifeState, bool) {
	switch ev {
	case onRun:
		if s.phase == phaseNew {
			s.phase = phaseStarting
			return s, true
		}
	case onClose:
		if !s.ran() {
			s.phase = phaseClosed
			return s, true
		}
	case onAttach:
		if !s.stopping && (s.phase == phaseStarting || s.phase == phaseDetached) {
			s.phase = phaseAttached
			return s, true
		}
	case onDetach:
		if s.phase == phaseAttached || s.phase == phaseStopping {
			s.phase = phaseDetached
			return s, true
		}
	case onDrain:
		if s.phase == phaseAttached {
			s.draining = true
			return s, true
		}
	case onRelease:
		if s.ran() {
			s.stopping = true
			if s.phase == phaseAttached {
				s.phase = phaseStopping
			}
			return s, true
		}
	case onStop:
		if s.ran() {
			s.phase = phaseStopped
		} else {
			s.phase = phaseClosed // stopped before Run (the callers stop a runner that ran)
		}
		return s, true
	}
	return s, false
}

// check returns the first invariant s breaks, or nil.
func (s lifeState) check() error {
	switch {
	case !s.ran() && (s.draining || s.stopping):
		return fmt.Errorf("%v before Run with Shutdown's progress (draining %v, stopping %v)", s.phase, s.draining, s.stopping)
	case s.phase == phaseStopping && !s.stopping:
		return fmt.Errorf("stopping phase outside Shutdown's release step")
	case s.phase == phaseAttached && s.stopping:
		return fmt.Errorf("attached in Shutdown's release step")
	case s.phase == phaseStarting && s.draining:
		return fmt.Errorf("draining before the first attach")
	}
	return nil
}

// toLocked moves the lifecycle by ev and reports whether it applied;
// a refused event changes nothing (the caller branches on it).
func (r *Runner) toLocked(ev phaseEvent) bool {
	to, ok := r.lifecycle.next(ev)
	if !ok {
		return false
	}
	if checkInvariants {
		if err := to.check(); err != nil {
			panic(fmt.Sprintf("runner: lifecycle: %v on %s: %v", r.lifecycle, ev, err))
		}
	}
	r.lifecycle = to
	r.allChangedLocked(false) // a parked request is answered if it may not wait any more
	return true
}
