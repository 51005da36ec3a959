package reminders

import "testing"

// TestTickWithdrawnWhenItsSetStoppedOrPausedWhileQueued: a tick handed to
// its entity's mailbox runs only if its set still fires when the entity
// reaches it. A set stopped (the shard was lost or released) or paused (a
// cutover began) while the tick waited — the shard's loss holds the set's
// lock while it stops it, so the tick's done waits for it — withdraws the
// tick: done reports false (no handler runs it here, after the shard
// left), the tick is not counted as fired (the next owner, or this set
// once it resumes, fires it), and nothing is scheduled.
func TestTickWithdrawnWhenItsSetStoppedOrPausedWhileQueued(t *testing.T) {
	for _, c := range []struct {
		name string
		st   setState
	}{
		{"stopped", setState{loaded: true, stopped: true}},
		{"paused", setState{loaded: true, paused: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			set := &shardSet{id: 7, st: c.st}
			r := &reminder{set: set, inFlight: true, firing: 18, lastFired: 17, next: 18}
			if r.done(true) {
				t.Fatalf("done(true) on a %s set = true: the tick's handler would run after its shard left", c.name)
			}
			if r.lastFired != 17 || r.next != 18 || r.inFlight {
				t.Errorf("after a withdrawn tick: lastFired %d, next %d, inFlight %v; want 17, 18, false (not counted, free to fire again)",
					r.lastFired, r.next, r.inFlight)
			}
		})
	}
}
