package runner

import (
	"testing"

	"github.com/shardhost/shardhost/runner/internal/handoff"
)

// TestHandoffPhaseNamesAreThePublicConstants: the phases the runner
// reports (handoff.Phase.String, in HandoffPhase.Phase) are exactly the
// public Phase* constants.
func TestHandoffPhaseNamesAreThePublicConstants(t *testing.T) {
	for p, want := range map[handoff.Phase]string{
		handoff.Warming: PhaseWarming,
		handoff.Ready:   PhaseReady,
		handoff.Drained: PhaseDrained,
		handoff.Cutover: PhaseCutover,
		handoff.Aborted: PhaseAborted,
	} {
		if got := p.String(); got != want {
			t.Errorf("handoff phase %d reported as %q, want %q", p, got, want)
		}
	}
}
