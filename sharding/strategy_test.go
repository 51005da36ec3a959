package sharding

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// allStrategies lists every strategy under test.
func allStrategies() []Strategy {
	return []Strategy{Rendezvous(), Balanced(), StickyBalanced(), JumpHash()}
}

// numbered returns m runners "<prefix>runner-0".."<prefix>runner-<m-1>" of
// weight 1: IDs JumpHash accepts.
func numbered(prefix string, m int) []Runner {
	rs := make([]Runner, m)
	for i := range rs {
		rs[i] = Runner{ID: fmt.Sprintf("%srunner-%d", prefix, i), Weight: 1}
	}
	return rs
}

// mustAssign calls s.Assign and fails the test on error.
func mustAssign(t testing.TB, s Strategy, in Input) Assignment {
	t.Helper()
	a, err := s.Assign(in)
	if err != nil {
		t.Fatalf("%s.Assign(%d shards, %d runners) error: %v", s.Name(), in.NumShards, len(in.Runners), err)
	}
	if len(a) != in.NumShards {
		t.Fatalf("%s.Assign(%d shards) returned %d shards", s.Name(), in.NumShards, len(a))
	}
	return a
}

// spread returns the largest and smallest count among the runners with
// weight > 0 in rs (runners without shards count 0).
func spread(a Assignment, rs []Runner) (lo, hi int) {
	counts := a.Counts()
	lo = -1
	for _, r := range rs {
		if r.Weight == 0 {
			continue
		}
		c := counts[r.ID]
		if lo < 0 || c < lo {
			lo = c
		}
		hi = max(hi, c)
	}
	return lo, hi
}

func TestDeterministicAcrossRunnerOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	inputs := []Input{
		{NumShards: 1, Runners: numbered("", 1)},
		{NumShards: 12, Runners: numbered("", 3)},
		{NumShards: 1024, Runners: numbered("", 10)},
		{NumShards: 1000, Runners: numbered("x-", 33)},
		{NumShards: 4096, Runners: append(numbered("", 5), Runner{ID: "drained", Weight: 0})},
		{NumShards: 999, Runners: []Runner{{"runner-0", 1}, {"runner-1", 2}, {"runner-2", 3}, {"runner-3", 7}}},
		{NumShards: 7, Runners: numbered("", 16)}, // fewer shards than runners
	}
	for _, s := range allStrategies() {
		for _, in := range inputs {
			// StickyBalanced starts from some other assignment.
			if s.Name() == nameStickyBalanced {
				in.Current = mustAssign(t, Rendezvous(), Input{NumShards: in.NumShards, Runners: in.Runners[:len(in.Runners)/2+1]})
			}
			want := mustAssign(t, s, in)
			for range 5 {
				shuffled := slices.Clone(in.Runners)
				rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
				got := mustAssign(t, s, Input{NumShards: in.NumShards, Runners: shuffled, Current: in.Current})
				if d := Diff(want, got); len(d) > 0 {
					t.Errorf("%s: Assign(%d shards, %v) differs from the unshuffled input at shards %v", s.Name(), in.NumShards, shuffled, d)
				}
			}
		}
	}
}

func TestAssignConcurrently(t *testing.T) {
	in := Input{NumShards: 512, Runners: numbered("", 7)}
	in.Current = mustAssign(t, Rendezvous(), Input{NumShards: 512, Runners: numbered("", 5)})
	for _, s := range allStrategies() {
		want := mustAssign(t, s, in)
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				if got, err := s.Assign(in); err != nil || !slices.Equal(got, want) {
					t.Errorf("%s: concurrent Assign differs: %v", s.Name(), err)
				}
			})
		}
		wg.Wait()
	}
}

func TestAssignValidation(t *testing.T) {
	ok := numbered("", 3)
	overweight := MaxWeight
	overweight++ // wraps to a negative weight where int has 32 bits
	tests := []struct {
		name string
		in   Input
		want error
	}{
		{"zero shards", Input{NumShards: 0, Runners: ok}, ErrInvalidNumShards},
		{"too many shards", Input{NumShards: MaxShards + 1, Runners: ok}, ErrInvalidNumShards},
		{"empty ID", Input{NumShards: 8, Runners: []Runner{{"runner-0", 1}, {"", 1}}}, ErrEmptyRunnerID},
		{"duplicate", Input{NumShards: 8, Runners: []Runner{{"runner-0", 1}, {"runner-1", 1}, {"runner-0", 2}}}, ErrDuplicateRunner},
		{"duplicate drained", Input{NumShards: 8, Runners: []Runner{{"runner-0", 0}, {"runner-0", 0}}}, ErrDuplicateRunner},
		{"negative weight", Input{NumShards: 8, Runners: []Runner{{"runner-0", -1}}}, ErrInvalidWeight},
		{"huge weight", Input{NumShards: 8, Runners: []Runner{{"runner-0", overweight}}}, ErrInvalidWeight},
		{"short current", Input{NumShards: 8, Runners: ok, Current: make(Assignment, 7)}, ErrInvalidCurrent},
		{"long current", Input{NumShards: 8, Runners: ok, Current: make(Assignment, 9)}, ErrInvalidCurrent},
	}
	for _, s := range allStrategies() {
		for _, tt := range tests {
			got, err := s.Assign(tt.in)
			if !errors.Is(err, tt.want) || got != nil {
				t.Errorf("%s: Assign(%s) = %v, %v, want nil, %v", s.Name(), tt.name, got, err, tt.want)
			}
		}
	}
}

func TestAssignErrorMessage(t *testing.T) {
	_, err := Balanced().Assign(Input{NumShards: 8, Runners: []Runner{{"a", 1}, {"a", 1}}})
	const want = `assign 8 shards (balanced): runner "a": sharding: duplicate runner ID`
	if err == nil || err.Error() != want {
		t.Errorf("Assign(duplicate) error = %v, want %s", err, want)
	}
}

func TestAssignNoActiveRunners(t *testing.T) {
	for _, s := range allStrategies() {
		for _, rs := range [][]Runner{nil, {}, {{"runner-0", 0}, {"drained", 0}}} {
			in := Input{NumShards: 16, Runners: rs, Current: make(Assignment, 16)}
			in.Current[3] = "drained"
			got, err := s.Assign(in)
			if err != nil || len(got) != 16 || len(got.ShardsOf("")) != 16 {
				t.Errorf("%s: Assign(%v) = %v, %v, want 16 unassigned shards, nil", s.Name(), rs, got, err)
			}
		}
	}
}

func TestAssignMaxWeightAndMaxShards(t *testing.T) {
	in := Input{NumShards: MaxShards, Runners: []Runner{{"runner-0", MaxWeight}, {"runner-1", MaxWeight}, {"runner-2", 1}}}
	for _, s := range []Strategy{Balanced(), StickyBalanced()} {
		got := mustAssign(t, s, in).Counts()
		want := map[string]int{"runner-0": MaxShards / 2, "runner-1": MaxShards / 2, "runner-2": 0}
		for id, w := range want {
			if got[id] != w {
				t.Errorf("%s: Assign(%v).Counts() = %v, want %v", s.Name(), in.Runners, got, want)
				break
			}
		}
	}
}

func TestStrategyByName(t *testing.T) {
	for _, s := range allStrategies() {
		got, err := StrategyByName(s.Name())
		if err != nil || got.Name() != s.Name() {
			t.Errorf("StrategyByName(%q) = %v, %v, want %s", s.Name(), got, err, s.Name())
		}
	}
	if got := Default().Name(); got != nameBalanced {
		t.Errorf("Default().Name() = %q, want %q", got, nameBalanced)
	}
	for _, name := range []string{"", "Balanced", "jump", "sticky"} {
		if got, err := StrategyByName(name); !errors.Is(err, ErrUnknownStrategy) || got != nil {
			t.Errorf("StrategyByName(%q) = %v, %v, want nil, %v", name, got, err, ErrUnknownStrategy)
		}
	}
}

// TestGoldenAssignments pins each strategy's output: every runner computes
// assignments on its own, so a change here means runners of the old and the
// new version disagree (a rolling upgrade would fight over shards). The
// weighted inputs also pin the platform-independent float code.
func TestGoldenAssignments(t *testing.T) {
	equal := Input{NumShards: 1024, Runners: numbered("", 7)}
	weighted := Input{NumShards: 1024, Runners: []Runner{{"runner-0", 1}, {"runner-1", 2}, {"runner-2", 3}, {"runner-3", 0}}}
	current := mustAssign(t, Rendezvous(), Input{NumShards: 1024, Runners: numbered("", 5)})
	tests := []struct {
		s    Strategy
		in   Input
		want uint64 // Hash64 of the assignment joined by ","
	}{
		{Rendezvous(), equal, 0x7c92cf0b96277fe5},
		{Rendezvous(), weighted, 0x1c8189786a77af30},
		{Balanced(), equal, 0x822cf4a378ad3c44},
		{Balanced(), weighted, 0x2438fa89ce7d7b00},
		{StickyBalanced(), Input{NumShards: 1024, Runners: equal.Runners, Current: current}, 0xca1e3154a661499f},
		{StickyBalanced(), Input{NumShards: 1024, Runners: weighted.Runners, Current: current}, 0x764b71028247e0a0},
		{JumpHash(), equal, 0x91cea59af9edbf93},
	}
	for _, tt := range tests {
		a := mustAssign(t, tt.s, tt.in)
		if got := Hash64(strings.Join(a, ",")); got != tt.want {
			t.Errorf("%s: Hash64(Assign(%v)) = %#x, want %#x", tt.s.Name(), tt.in.Runners, got, tt.want)
		}
	}
}

// TestIgnoresCurrent: the strategies that say they ignore Input.Current do
// (the same assignment whatever Current is); sticky-balanced does not say so.
func TestIgnoresCurrent(t *testing.T) {
	runners := numbered("", 5)
	for _, s := range allStrategies() {
		if !IgnoresCurrent(s) {
			if s.Name() != nameStickyBalanced {
				t.Errorf("%s does not ignore Current", s.Name())
			}
			continue
		}
		base := mustAssign(t, s, Input{NumShards: 256, Runners: runners})
		skewed := make(Assignment, 256)
		for i := range skewed {
			skewed[i] = runners[0].ID
		}
		if got := mustAssign(t, s, Input{NumShards: 256, Runners: runners, Current: skewed}); !slices.Equal(got, base) {
			t.Errorf("%s says it ignores Current but its assignment changed with it", s.Name())
		}
	}
	if IgnoresCurrent(StickyBalanced()) {
		t.Error("sticky-balanced claims to ignore Current")
	}
}
