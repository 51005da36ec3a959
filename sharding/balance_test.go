package sharding

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestBalancedEqualWeights(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, s := range []Strategy{Balanced(), StickyBalanced()} {
		for _, n := range []int{1, 2, 7, 12, 100, 1000, 1024, 16384} {
			for _, m := range []int{1, 2, 3, 5, 7, 10, 16, 33, 100, 150} {
				rs := numbered("", m)
				currents := []Assignment{nil}
				if s.Name() == nameStickyBalanced {
					// Skewed and partly foreign current owners.
					skewed := make(Assignment, n)
					for i := range skewed {
						switch rng.IntN(4) {
						case 0:
							skewed[i] = "gone"
						case 1:
							skewed[i] = rs[0].ID
						default:
							skewed[i] = rs[rng.IntN(m)].ID
						}
					}
					currents = append(currents, skewed)
				}
				for _, cur := range currents {
					in := Input{NumShards: n, Runners: rs, Current: cur}
					a := mustAssign(t, s, in)
					if lo, hi := spread(a, rs); hi-lo > 1 {
						t.Errorf("%s: Assign(%d shards, %d runners) counts range %d..%d, want max-min <= 1", s.Name(), n, m, lo, hi)
					}
				}
			}
		}
	}
}

func TestDrainedRunnerGetsNothing(t *testing.T) {
	rs := append(numbered("", 4), Runner{ID: "runner-4", Weight: 0}, Runner{ID: "spare", Weight: 0})
	prev := mustAssign(t, Rendezvous(), Input{NumShards: 1024, Runners: numbered("", 5)})
	for _, s := range allStrategies() {
		a := mustAssign(t, s, Input{NumShards: 1024, Runners: rs, Current: prev})
		for _, id := range []string{"runner-4", "spare"} {
			if got := a.ShardsOf(id); len(got) != 0 {
				t.Errorf("%s: Assign(%v) gives %d shards to drained %s, want 0", s.Name(), rs, len(got), id)
			}
		}
		if got := a.ShardsOf(""); len(got) != 0 {
			t.Errorf("%s: Assign(%v) left shards %v unassigned", s.Name(), rs, got)
		}
	}
}

func TestWeightedQuotas(t *testing.T) {
	tests := []struct {
		n       int
		weights []int
	}{
		{1024, []int{1, 2, 3, 4}},
		{16384, []int{1, 1, 1, 5}},
		{1000, []int{3, 3, 3}},
		{10, []int{1, 1000}},
		{16384, []int{100, 150, 200, 1, 0, 7, 7}},
		{MaxShards, []int{MaxWeight, MaxWeight - 1, 1}},
	}
	for _, s := range []Strategy{Balanced(), StickyBalanced()} {
		for _, tt := range tests {
			rs := make([]Runner, len(tt.weights))
			total := 0.0
			for i, w := range tt.weights {
				rs[i] = Runner{ID: fmt.Sprintf("runner-%d", i), Weight: w}
				total += float64(w)
			}
			counts := mustAssign(t, s, Input{NumShards: tt.n, Runners: rs}).Counts()
			for _, r := range rs {
				exact := float64(tt.n) * float64(r.Weight) / total
				if got := float64(counts[r.ID]); math.Abs(got-exact) >= 1 {
					t.Errorf("%s: Assign(%d shards, %v) gives %s %v shards, want within 1 of %.2f", s.Name(), tt.n, rs, r.ID, got, exact)
				}
			}
		}
	}
}

// TestRendezvousWeighted checks that weighted rendezvous gives each runner
// its proportional share up to binomial noise.
func TestRendezvousWeighted(t *testing.T) {
	const n = 16384
	rs := []Runner{{"runner-0", 1}, {"runner-1", 2}, {"runner-2", 3}, {"runner-3", 4}, {"runner-4", 10}}
	counts := mustAssign(t, Rendezvous(), Input{NumShards: n, Runners: rs}).Counts()
	for _, r := range rs {
		p := float64(r.Weight) / 20
		mean, sd := n*p, math.Sqrt(n*p*(1-p))
		if got := float64(counts[r.ID]); math.Abs(got-mean) > 4*sd {
			t.Errorf("Rendezvous().Assign(%d shards, %v) gives %s %v shards, want %.0f ± %.0f", n, rs, r.ID, got, mean, 4*sd)
		}
	}
}

// TestRendezvousSpread checks that equal-weight rendezvous loads look
// binomial, which exercises the quality of the pair hash.
func TestRendezvousSpread(t *testing.T) {
	const n, m = 16384, 16
	counts := mustAssign(t, Rendezvous(), Input{NumShards: n, Runners: numbered("", m)}).Counts()
	var chi2 float64
	for _, c := range counts {
		d := float64(c) - n/m
		chi2 += d * d / (n / m)
	}
	// 99.9th percentile of chi-squared with 15 degrees of freedom.
	if chi2 > 37.7 || len(counts) != m {
		t.Errorf("Rendezvous().Assign(%d shards, %d runners).Counts() = %v: chi2 = %.1f, want <= 37.7", n, m, counts, chi2)
	}
}

// greedyMatch is the reference for stableMatch: walk all (shard, member)
// pairs from the best rank key down and take a pair when its shard is free
// and its member has room.
func greedyMatch(ms []member, q []int, n int) Assignment {
	type pair struct {
		key           uint64
		member, shard int
	}
	r := newRanking(ms)
	var pairs []pair
	for s := range n {
		for i := range ms {
			pairs = append(pairs, pair{r.key(i, shardKey(s)), i, s})
		}
	}
	slices.SortFunc(pairs, func(a, b pair) int {
		return cmp.Or(cmp.Compare(b.key, a.key), cmp.Compare(a.member, b.member), cmp.Compare(a.shard, b.shard))
	})
	out := make(Assignment, n)
	room := slices.Clone(q)
	for _, p := range pairs {
		if out[p.shard] == "" && room[p.member] > 0 {
			out[p.shard] = ms[p.member].id
			room[p.member]--
		}
	}
	return out
}

func TestBalancedIsStableMatching(t *testing.T) {
	tests := []Input{
		{NumShards: 64, Runners: numbered("", 3)},
		{NumShards: 500, Runners: numbered("", 7)},
		{NumShards: 1000, Runners: numbered("x", 40)},
		{NumShards: 5, Runners: numbered("", 9)},
		{NumShards: 777, Runners: []Runner{{"a", 1}, {"b", 2}, {"c", 3}, {"d", 0}, {"e", 9}}},
	}
	for _, in := range tests {
		ms, err := members(in)
		if err != nil {
			t.Fatal(err)
		}
		want := greedyMatch(ms, quotas(ms, in.NumShards, nil), in.NumShards)
		got := mustAssign(t, Balanced(), in)
		if d := Diff(got, want); len(d) > 0 {
			t.Errorf("Balanced().Assign(%d shards, %v) differs from the greedy stable matching at shards %v", in.NumShards, in.Runners, d)
		}
	}
}

// TestBalancedFollowsRendezvous checks that Balanced keeps most shards with
// their rendezvous winner: the load correction is about 0.5*sqrt(N*M) shards.
func TestBalancedFollowsRendezvous(t *testing.T) {
	for _, m := range []int{3, 10, 100} {
		in := Input{NumShards: 16384, Runners: numbered("", m)}
		d := len(Diff(mustAssign(t, Rendezvous(), in), mustAssign(t, Balanced(), in)))
		if limit := math.Sqrt(16384 * float64(m)); float64(d) > limit {
			t.Errorf("Balanced and Rendezvous differ on %d of 16384 shards for %d runners, want <= %.0f", d, m, limit)
		}
	}
}

// TestStickyBalancedMovesMinimum compares StickyBalanced with the least
// movement any balanced assignment needs from the same current owners:
// each runner keeps at most its quota, and the extra shards (N mod M) go
// to runners that hold more than the floor where possible.
func TestStickyBalancedMovesMinimum(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for range 50 {
		n := 1 + rng.IntN(2000)
		m := 1 + rng.IntN(40)
		rs := numbered("", m)
		cur := make(Assignment, n)
		for i := range cur {
			if j := rng.IntN(m + 2); j < m {
				cur[i] = rs[j].ID
			} else if j == m {
				cur[i] = "gone"
			}
		}
		floor, extras := n/m, n%m
		kept, over := 0, 0
		counts := cur.Counts()
		for _, r := range rs {
			kept += min(counts[r.ID], floor)
			if counts[r.ID] > floor {
				over++
			}
		}
		kept += min(extras, over)
		in := Input{NumShards: n, Runners: rs, Current: cur}
		a := mustAssign(t, StickyBalanced(), in)
		if got, want := len(Diff(cur, a)), n-kept; got != want {
			t.Errorf("StickyBalanced().Assign(%d shards, %d runners) moved %d shards, want the minimum %d", n, m, got, want)
		}
		if lo, hi := spread(a, rs); hi-lo > 1 {
			t.Errorf("StickyBalanced().Assign(%d shards, %d runners) counts range %d..%d, want max-min <= 1", n, m, lo, hi)
		}
	}
}

func TestStickyBalancedKeepsBalancedState(t *testing.T) {
	for _, m := range []int{1, 3, 10, 100} {
		in := Input{NumShards: 1024, Runners: numbered("", m)}
		in.Current = mustAssign(t, Balanced(), in)
		if d := Diff(in.Current, mustAssign(t, StickyBalanced(), in)); len(d) > 0 {
			t.Errorf("StickyBalanced().Assign(balanced state, %d runners) moved shards %v, want none", m, d)
		}
	}
}

func TestStickyBalancedDealsWithoutCurrent(t *testing.T) {
	in := Input{NumShards: 6, Runners: []Runner{{"c", 1}, {"a", 1}, {"b", 1}}}
	want := Assignment{"a", "b", "c", "a", "b", "c"}
	got := mustAssign(t, StickyBalanced(), in)
	if !slices.Equal(got, want) {
		t.Errorf("StickyBalanced().Assign(%v) = %v, want %v", in, got, want)
	}
}
