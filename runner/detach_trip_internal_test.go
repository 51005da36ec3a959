package runner

import (
	"testing"
	"time"

	"github.com/shardhost/shardhost/lease"
)

// TestDetachInstantActedOnOutlivesARenewal: once a handler's check saw the
// detach instant pass (its result withheld, its instance discarded), a
// renewal landing afterwards does not move the instant: the watchdog is
// told to detach, so the runner cannot keep the shard at the same epoch
// with that instance's state silently lost. An instant that passed
// unobserved moves with the renewal; a new attachment publishes its own.
func TestDetachInstantActedOnOutlivesARenewal(t *testing.T) {
	t.Parallel()
	r := newUnstartedRunner(t)
	if !r.wd.machine.Enabled() {
		t.Fatal("detachment disabled by default")
	}
	expired := lease.Health{Lease: 1, Healthy: true, Deadline: time.Now().Add(-time.Second)}
	renewed := lease.Health{Lease: 1, Healthy: true, Deadline: time.Now().Add(time.Hour)}

	r.trip.reset(expired)
	r.trip.set(renewed)
	if r.trip.past() || r.trip.acted() {
		t.Fatal("an instant that passed unobserved still counts after a renewal")
	}

	r.trip.reset(expired)
	if !r.trip.past() {
		t.Fatal("pastTrip = false past the detach instant")
	}
	r.trip.set(renewed)
	if !r.trip.past() {
		t.Error("a renewal moved a detach instant already acted on: pastTrip = false")
	}
	if !r.trip.acted() {
		t.Error("the watchdog is not told to detach after a renewal that followed an acted-on instant")
	}

	r.trip.reset(renewed) // the next attachment
	if r.trip.past() || r.trip.acted() {
		t.Error("a new attachment kept the instant acted on under the one before")
	}
}
