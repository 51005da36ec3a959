package control

import "time"

// StormGate decides when a membership change is acted on: an isolated
// departure at once, anything else once the view has been quiet (2
// debounces; 5 debounces for a runner that owns nothing yet) or, in a long
// storm, after 10 debounces (50 for a runner that owns nothing). The zero
// value is a gate that has seen no change.
type StormGate struct {
	last  time.Time // the last change
	since time.Time // the first change not acted on (zero: none)
}

// Change records a change at now; it reports whether to recompute now,
// else how long the view must stay quiet before the debounce fires.
//
// A runner that owns shards (owns) waits 2 debounces of quiet: runners
// joining or draining in a burst come about a debounce apart, and one
// debounce would fire between two of them — the recompute mid-burst would
// abandon the takeovers started on the assignment before. It must still
// shed its shards to newcomers in a long storm (10 debounces). One that
// owns nothing yet waits longer (5 debounces, at most 50): it has nothing
// to hand over, and taking shards on a view that is still growing —
// runners starting together register over a second or more — would only
// start handoffs; the caller passes owns for a runner that owns nothing
// but joins a cluster whose every shard is locked by a live runner (it can
// take shards by handoff only, and no cold start is under way). A
// departure (a runner left: its shards are free) after a quiet period is
// acted on at once.
func (g *StormGate) Change(now time.Time, debounce time.Duration, departure, owns bool) (recompute bool, quiet time.Duration) {
	wasQuiet := g.last.IsZero() || now.Sub(g.last) >= debounce
	g.last = now
	if g.since.IsZero() {
		g.since = now
	}
	quiet, limit := 5*debounce, 50*debounce
	if owns {
		quiet, limit = 2*debounce, 10*debounce
	}
	if (wasQuiet && departure) || now.Sub(g.since) >= limit {
		g.since = time.Time{}
		return true, 0
	}
	return false, quiet
}

// Settled records that the debounce fired (the change was acted on).
func (g *StormGate) Settled() { g.since = time.Time{} }

// QuietFor reports whether every change was acted on and none came for d
// before now.
func (g *StormGate) QuietFor(now time.Time, d time.Duration) bool {
	return g.since.IsZero() && (g.last.IsZero() || now.Sub(g.last) >= d)
}
