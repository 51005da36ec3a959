package sharding

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// TestPlannerAssignsExactlyAsItsStrategy drives Planners through random
// membership changes — joins, departures, several at once, weight changes,
// draining runners, a weight mode switch, a new NumShards — and checks
// every result against a fresh Assign of the same input. The small sizes
// make shards propose past their kept prefixes and force rebuilds.
func TestPlannerAssignsExactlyAsItsStrategy(t *testing.T) {
	for _, size := range []struct{ n, m int }{{1, 1}, {5, 9}, {7, 3}, {64, 9}, {500, 12}, {1024, 40}, {2048, 300}} {
		if size.m > rankBatchFrom && raceEnabled {
			continue // batched ranking: 4 s under -race for nothing it can find; make test runs it without
		}
		for _, weighted := range []bool{false, true} {
			t.Run(fmt.Sprintf("%dx%d/weighted=%v", size.n, size.m, weighted), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(size.n), uint64(size.m)))
				p := NewPlanner(Balanced())
				rs := numbered("", size.m)
				nextID := size.m
				n := size.n
				for step := range 60 {
					switch c := rng.IntN(10); {
					case c < 3 || len(rs) < 2: // a join, sometimes a burst
						for range 1 + rng.IntN(3) {
							rs = append(rs, Runner{ID: fmt.Sprintf("runner-%d", nextID), Weight: 1})
							nextID++
						}
					case c < 6: // a departure, sometimes several
						for range 1 + rng.IntN(min(3, len(rs)-1)) {
							i := rng.IntN(len(rs))
							rs = slices.Delete(rs, i, i+1)
						}
					case c < 8: // draining, or back
						i := rng.IntN(len(rs))
						rs[i].Weight = 1 - min(rs[i].Weight, 1)
					case c < 9 && weighted:
						rs[rng.IntN(len(rs))].Weight = 1 + rng.IntN(4)
					default:
						if rng.IntN(8) == 0 {
							n = max(1, n+rng.IntN(9)-4)
						}
					}
					if rng.IntN(4) == 0 {
						p.Prepare() // as a runner does once membership is quiet
					}
					in := Input{NumShards: n, Runners: slices.Clone(rs)}
					rng.Shuffle(len(in.Runners), func(i, j int) { in.Runners[i], in.Runners[j] = in.Runners[j], in.Runners[i] })
					want := mustAssign(t, Balanced(), in)
					got, err := p.Assign(in)
					if err != nil {
						t.Fatalf("step %d: Planner.Assign(%d shards, %d runners) error: %v", step, n, len(rs), err)
					}
					if d := Diff(want, got); len(d) > 0 {
						t.Fatalf("step %d: Planner.Assign(%d shards, %d runners) differs from Balanced at %d shards (first %d: %q, want %q)",
							step, n, len(rs), len(d), d[0], got[d[0]], want[d[0]])
					}
				}
			})
		}
	}
}

// TestPlannerWidensItsPrefixesPast255Runners drives a Planner whose
// prefixes start one byte an entry (250 runners) through joins that need
// slots of 255 and more, in the middle of an update, then departures and
// repeated inputs, checking every result against a fresh Assign.
func TestPlannerWidensItsPrefixesPast255Runners(t *testing.T) {
	p := NewPlanner(Balanced())
	rs := numbered("", 250)
	check := func(step string) {
		t.Helper()
		in := Input{NumShards: 600, Runners: slices.Clone(rs)}
		want := mustAssign(t, Balanced(), in)
		got, err := p.Assign(in)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if d := Diff(want, got); len(d) > 0 {
			t.Fatalf("%s: Planner.Assign (%d runners) differs from Balanced at %d shards", step, len(rs), len(d))
		}
	}
	check("cold")
	rs = append(rs, Runner{ID: "joiner-0", Weight: 1})
	check("the first join") // builds the prefixes
	if p.pre.narrow == nil {
		t.Fatal("the prefixes of 251 runners are wide")
	}
	for i := 1; len(rs) < 262; i++ {
		for k := range 1 + i%3 {
			rs = append(rs, Runner{ID: fmt.Sprintf("joiner-%d-%d", i, k), Weight: 1})
		}
		check(fmt.Sprintf("join %d (%d runners)", i, len(rs)))
	}
	if p.pre.wide == nil || p.pre.narrow != nil {
		t.Fatal("the prefixes did not widen past 255 slots")
	}
	for i := range 6 {
		rs = slices.Delete(rs, i*37%len(rs), i*37%len(rs)+1)
		check(fmt.Sprintf("departure %d", i))
		check(fmt.Sprintf("departure %d, the same input again", i))
	}
}

// TestPlannerPrepareBuildsThePrefixesOfTheLastInput: after a fresh
// computation (a cold start's), Prepare builds the prefixes, so that the
// next join is an update of them, not a rebuild; and a Prepare racing
// Assign never changes a result.
func TestPlannerPrepareBuildsThePrefixesOfTheLastInput(t *testing.T) {
	p := NewPlanner(Balanced())
	rs := numbered("", 20)
	assign := func(step string) {
		t.Helper()
		in := Input{NumShards: 2048, Runners: slices.Clone(rs)}
		got, err := p.Assign(in)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		if d := Diff(mustAssign(t, Balanced(), in), got); len(d) > 0 {
			t.Fatalf("%s: Planner.Assign differs from Balanced at %d shards", step, len(d))
		}
	}
	if !p.Prepared() {
		t.Fatal("a Planner with no input is not Prepared")
	}
	assign("cold")
	if p.Prepared() {
		t.Fatal("Prepared after a fresh computation")
	}
	p.Prepare()
	if !p.Prepared() {
		t.Fatal("not Prepared after Prepare")
	}
	first := &p.pre.narrow[0]
	rs = append(rs, Runner{ID: "joiner", Weight: 1})
	assign("a join after Prepare")
	if &p.pre.narrow[0] != first {
		t.Fatal("the join rebuilt the prefixes Prepare built")
	}
	// Many runners at once: a fresh computation again, while Prepares
	// run beside the Assigns.
	for i := range 6 {
		rs = numbered(fmt.Sprintf("gen%d-", i), 20+i)
		var wg sync.WaitGroup
		wg.Go(p.Prepare)
		assign(fmt.Sprintf("generation %d", i))
		wg.Go(p.Prepare)
		wg.Wait()
		rs = append(rs, Runner{ID: "joiner", Weight: 1})
		assign(fmt.Sprintf("generation %d, a join", i))
	}
	if q := NewPlanner(JumpHash()); !q.Prepared() {
		t.Fatal("a Planner of another strategy is not Prepared")
	}
}

// TestPlannerAtScale checks a Planner against Balanced through single
// joins and departures at 16384 shards x 100 runners, the scale the
// Planner is for.
func TestPlannerAtScale(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("O(N*M) reference assignments")
	}
	p := NewPlanner(Balanced())
	rs := numbered("", 100)
	for step := range 12 {
		if step%2 == 1 {
			rs = append(rs, Runner{ID: fmt.Sprintf("joiner-%d", step), Weight: 1})
		} else if step > 0 {
			rs = slices.Delete(rs, step*7%len(rs), step*7%len(rs)+1)
		}
		in := Input{NumShards: 16384, Runners: rs}
		want := mustAssign(t, Balanced(), in)
		got, err := p.Assign(in)
		if err != nil {
			t.Fatal(err)
		}
		if d := Diff(want, got); len(d) > 0 {
			t.Fatalf("step %d: Planner.Assign differs from Balanced at %d shards", step, len(d))
		}
	}
}

// TestPlannerPassesOtherStrategiesThrough checks that a Planner of another
// strategy returns that strategy's result, Current included, and that
// invalid inputs fail with the strategy's errors.
func TestPlannerPassesOtherStrategiesThrough(t *testing.T) {
	rs := numbered("", 5)
	cur := mustAssign(t, Balanced(), Input{NumShards: 256, Runners: rs[1:]})
	for _, s := range allStrategies() {
		in := Input{NumShards: 256, Runners: rs, Current: cur}
		got, err := NewPlanner(s).Assign(in)
		if err != nil {
			t.Fatalf("%s: Planner.Assign error: %v", s.Name(), err)
		}
		if want := mustAssign(t, s, in); !slices.Equal(got, want) {
			t.Errorf("%s: Planner.Assign differs from the strategy's Assign at %d shards", s.Name(), len(Diff(want, got)))
		}
		bad := Input{NumShards: 256, Runners: []Runner{{ID: "a", Weight: 1}, {ID: "a", Weight: 1}}}
		if _, err := NewPlanner(s).Assign(bad); !errors.Is(err, ErrDuplicateRunner) {
			t.Errorf("%s: Planner.Assign(duplicate IDs) error = %v, want ErrDuplicateRunner", s.Name(), err)
		}
	}
}

// TestPlannerResultIsTheCallers checks that changing a returned assignment
// does not change the next result.
func TestPlannerResultIsTheCallers(t *testing.T) {
	p := NewPlanner(Balanced())
	in := Input{NumShards: 64, Runners: numbered("", 3)}
	a, _ := p.Assign(in)
	a[0] = "changed"
	b, _ := p.Assign(in)
	if want := mustAssign(t, Balanced(), in); !slices.Equal(b, want) {
		t.Errorf("Planner.Assign after the caller changed a result = %v..., want %v...", b[:1], want[:1])
	}
}
