package main

import (
	"testing"

	"github.com/shardhost/shardhost/storage"
)

// TestRunnerStateSaysHowARunnerTakesPart: each combination of a record's
// weight, draining and stopped, and of a pending drain request, reads as
// the state the status table shows.
func TestRunnerStateSaysHowARunnerTakesPart(t *testing.T) {
	for _, c := range []struct {
		rec       storage.RunnerRecord
		requested bool
		want      string
	}{
		{storage.RunnerRecord{Weight: 1}, false, "active"},
		{storage.RunnerRecord{Weight: 1}, true, "drain requested"},
		{storage.RunnerRecord{Weight: 1, Draining: true}, true, "draining"},
		{storage.RunnerRecord{Weight: 0, Draining: true}, false, "shutting down"},
		{storage.RunnerRecord{Weight: 0, Draining: true, Stopped: true}, false, "stopped"},
		{storage.RunnerRecord{Weight: 0}, false, "weight 0"},
	} {
		if got := runnerState(storage.Runner{RunnerRecord: c.rec}, c.requested); got != c.want {
			t.Errorf("runnerState(%+v, requested %v) = %q, want %q", c.rec, c.requested, got, c.want)
		}
	}
}
