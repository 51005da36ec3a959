package sharding

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

// movement is the outcome of one join and one leave for a strategy.
type movement struct {
	joinMoved  int // shards that changed owner when the runner joined
	joinerGot  int // shards the joiner got: the least that had to move
	leaveMoved int // shards that changed owner when the runner left
	leaverHad  int // shards the leaver had: the least that had to move
}

// measureMovement starts from m numbered runners (name prefix p) over n
// shards, lets runner m join and, separately, runner leaver leave.
// StickyBalanced starts from the Balanced assignment and is given the
// previous assignment as Current.
func measureMovement(t testing.TB, s Strategy, n, m int, p string, leaver int) movement {
	t.Helper()
	rs := numbered(p, m)
	in := Input{NumShards: n, Runners: rs}
	if s.Name() == nameStickyBalanced {
		in.Current = mustAssign(t, Balanced(), in)
	}
	before := mustAssign(t, s, in)
	joiner := fmt.Sprintf("%srunner-%d", p, m)
	joined := append(slices.Clone(rs), Runner{ID: joiner, Weight: 1})
	after := mustAssign(t, s, Input{NumShards: n, Runners: joined, Current: before})
	left := slices.Delete(slices.Clone(rs), leaver, leaver+1)
	afterLeave := mustAssign(t, s, Input{NumShards: n, Runners: left, Current: before})
	return movement{
		joinMoved:  len(Diff(before, after)),
		joinerGot:  len(after.ShardsOf(joiner)),
		leaveMoved: len(Diff(before, afterLeave)),
		leaverHad:  len(before.ShardsOf(rs[leaver].ID)),
	}
}

// TestMovement measures, for each strategy, how many shards move when a
// runner joins or leaves, relative to the optimum, and prints the table
// with -v.
//
// The optimum of a join is the joiner's exact share N/(M+1): its shards must
// come from elsewhere. The optimum of a leave is the number of shards the
// leaver had. A cell's ratio is sum(moved)/sum(optimum) over trials with
// different runner names (JumpHash ignores names, so its trials agree).
//
// Rendezvous, JumpHash and StickyBalanced must move exactly the necessary
// shards in every trial (for Rendezvous and JumpHash the joiner's share
// itself varies around N/(M+1)). Balanced also moves a load correction of
// about 0.25-0.9 * sqrt(N) shards, so its ratio grows with M/sqrt(N); the
// bound allows 1.5 * sqrt(N).
func TestMovement(t *testing.T) {
	if testing.Short() {
		t.Skip("slow in -short mode")
	}
	if raceEnabled {
		// Pure computation on one goroutine: the race detector has nothing
		// to find and makes it ~10x slower. make test runs it without.
		t.Skip("runs without -race (make test: go test -run '^TestMovement$' ./sharding/)")
	}
	const trials = 4
	shardCounts := []int{1024, 16384}
	runnerCounts := []int{3, 5, 8, 10, 16, 32, 50, 100}
	var table strings.Builder
	fmt.Fprintf(&table, "%-16s %6s %4s %10s %11s\n", "strategy", "shards", "M", "join ratio", "leave ratio")
	for _, s := range allStrategies() {
		exact := s.Name() != nameBalanced
		var sumJoin float64
		for _, n := range shardCounts {
			for _, m := range runnerCounts {
				var joinMoved, leaveMoved, leaverHad int
				for trial := range trials {
					leaver := (trial * 7) % m
					if s.Name() == nameJumpHash {
						leaver = m - 1 // the only runner that can leave
					}
					mv := measureMovement(t, s, n, m, fmt.Sprintf("t%d-", trial), leaver)
					if exact && (mv.joinMoved != mv.joinerGot || mv.leaveMoved != mv.leaverHad) {
						t.Errorf("%s: %d shards, %d runners, trial %d: moved %d on join (joiner got %d), %d on leave (leaver had %d), want equal",
							s.Name(), n, m, trial, mv.joinMoved, mv.joinerGot, mv.leaveMoved, mv.leaverHad)
					}
					joinMoved += mv.joinMoved
					leaveMoved += mv.leaveMoved
					leaverHad += mv.leaverHad
				}
				join := float64(joinMoved) / (trials * float64(n) / float64(m+1))
				leave := float64(leaveMoved) / float64(leaverHad)
				sumJoin += join
				fmt.Fprintf(&table, "%-16s %6d %4d %10.3f %11.3f\n", s.Name(), n, m, join, leave)
				if !exact {
					maxJoin := 1 + 1.5*math.Sqrt(float64(n))/(float64(n)/float64(m+1))
					maxLeave := 1 + 1.5*math.Sqrt(float64(n))/(float64(n)/float64(m))
					if join > maxJoin || leave > maxLeave {
						t.Errorf("%s: %d shards, %d runners: moved/optimum = %.3f on join, %.3f on leave, want <= %.3f, <= %.3f",
							s.Name(), n, m, join, leave, maxJoin, maxLeave)
					}
				}
			}
		}
		// The joiner's share is N/(M+1) on average.
		if mean := sumJoin / float64(len(shardCounts)*len(runnerCounts)); exact && (mean < 0.9 || mean > 1.15) {
			t.Errorf("%s: mean join ratio = %.3f, want 0.9..1.15", s.Name(), mean)
		}
	}
	t.Logf("shards moved / optimum, %d trials per cell:\n%s", trials, table.String())
}
