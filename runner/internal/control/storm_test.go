package control

import (
	"testing"
	"time"
)

// TestStormGateActsOnQuietViews: membership changes are acted on when the
// view has been quiet (the loop's timer: 2 debounces, 5 for a runner that
// owns nothing), an isolated departure at once, and in a storm at most
// every 10 debounces by a runner that owns shards, every 50 by one that
// owns none.
func TestStormGateActsOnQuietViews(t *testing.T) {
	const d = 100 * time.Millisecond
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

	var g StormGate
	if now, _ := g.Change(at(0), d, true, true); !now {
		t.Error("an isolated departure after a quiet period waits")
	}
	if now, _ := g.Change(at(50), d, true, true); now {
		t.Error("a departure 50ms after another change is acted on at once")
	}
	g.Settled()
	if now, quiet := g.Change(at(1000), d, false, true); now || quiet != 2*d {
		t.Errorf("a join: now %v, quiet %v; want 2 debounces", now, quiet)
	}
	g.Settled()
	if now, quiet := g.Change(at(2000), d, false, false); now || quiet != 5*d {
		t.Errorf("a join seen by a runner that owns nothing: now %v, quiet %v; want 5 debounces", now, quiet)
	}
	g.Settled()

	// A storm: a change every 20ms.
	for _, tc := range []struct {
		owns  bool
		first int // ms of the first recompute the gate asks for
	}{{true, 1000}, {false, 5000}} {
		var g StormGate
		first := -1
		for ms := 0; ms <= 6000 && first < 0; ms += 20 {
			if now, _ := g.Change(at(ms), d, false, tc.owns); now {
				first = ms
			}
		}
		if first != tc.first {
			t.Errorf("owns %v: storm acted on after %dms, want %dms", tc.owns, first, tc.first)
		}
	}
}

// TestStormGateStartsAStormAfterActingOnIt: once the gate asked for a
// recompute (a storm reached its limit), the limit counts again from the
// next change, not from the first change of the storm.
func TestStormGateStartsAStormAfterActingOnIt(t *testing.T) {
	const d = 100 * time.Millisecond
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var g StormGate
	var acted []int
	for ms := 0; ms <= 2500; ms += 20 {
		if now, _ := g.Change(t0.Add(time.Duration(ms)*time.Millisecond), d, false, true); now {
			acted = append(acted, ms)
		}
	}
	if want := []int{1000, 2020}; len(acted) != len(want) || acted[0] != want[0] || acted[1] != want[1] {
		t.Errorf("a 2.5s storm was acted on at %v ms, want %v", acted, want)
	}
}

// TestStormGateWaitsForTheEndOfABurstOneDebounceApart: runners joining
// (or starting to drain) one after another after a quiet period, each
// about one debounce after the previous, are acted on once, after the last
// of them: the quiet the gate asks for outlasts the gap to the next
// change, the first one's included, so the loop's timer never fires
// mid-burst (a recompute there abandons the takeovers started on the
// assignment before it).
func TestStormGateWaitsForTheEndOfABurstOneDebounceApart(t *testing.T) {
	const d = 100 * time.Millisecond
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, gap := range []time.Duration{d, d + 5*time.Millisecond, d + d/10} { // 10 changes within about a second
		var g StormGate
		g.Change(t0.Add(-time.Minute), d, false, true) // the change before, long settled
		g.Settled()
		var fireAt time.Time // the loop's debounce timer (zero: stopped)
		var fired []time.Duration
		at := t0.Add(-gap)
		for range 10 {
			at = at.Add(gap)
			if !fireAt.IsZero() && !fireAt.After(at) {
				fired = append(fired, fireAt.Sub(t0))
				g.Settled()
			}
			fireAt = time.Time{}
			now, quiet := g.Change(at, d, false, true)
			if now {
				fired = append(fired, at.Sub(t0))
				continue
			}
			fireAt = at.Add(quiet)
		}
		if len(fired) != 0 {
			t.Errorf("changes %v apart: the gate acted mid-burst at %v; want only after the last change (%v)", gap, fired, at.Sub(t0))
		}
		if fireAt.IsZero() {
			t.Errorf("changes %v apart: the last change is never acted on", gap)
		}
	}
}
