package sharding

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Errors returned by the strategies, wrapped with context; match them with
// [errors.Is]. [ErrInvalidNumShards] (see [ValidateNumShards]) belongs to the
// same family.
var (
	// ErrEmptyRunnerID reports a runner whose ID is "".
	ErrEmptyRunnerID = errors.New("sharding: empty runner ID")
	// ErrDuplicateRunner reports two runners with the same ID.
	ErrDuplicateRunner = errors.New("sharding: duplicate runner ID")
	// ErrInvalidWeight reports a weight outside [0, MaxWeight].
	ErrInvalidWeight = errors.New("sharding: invalid runner weight")
	// ErrInvalidCurrent reports an Input.Current whose length is not NumShards.
	ErrInvalidCurrent = errors.New("sharding: current assignment has the wrong length")
	// ErrBadOrdinal reports a runner set that JumpHash cannot number 0..M-1;
	// the error is an [*OrdinalError] carrying the details.
	ErrBadOrdinal = errors.New("sharding: bad runner ordinal")
	// ErrUnknownStrategy reports a name that StrategyByName does not know.
	ErrUnknownStrategy = errors.New("sharding: unknown strategy")
)

// MaxWeight is the largest valid [Runner.Weight].
const MaxWeight = math.MaxInt32

// Runner is one member of the cluster as seen by a [Strategy].
type Runner struct {
	// ID is the unique, stable name of the runner. It must not be "".
	ID string
	// Weight is the runner's capacity relative to the other runners: a
	// runner of weight 2 is meant to get twice the shards of a runner of
	// weight 1. Weight 0 means draining: the runner gets no shards. Valid
	// weights are 0..MaxWeight.
	Weight int
}

// Assignment maps each shard, by index (the [ShardID]), to the ID of the
// runner it is assigned to. "" means unassigned, which strategies produce only
// when no runner has a weight above zero.
type Assignment []string

// ShardsOf returns, in ascending order, the shards assigned to runnerID.
// ShardsOf("") returns the unassigned shards.
func (a Assignment) ShardsOf(runnerID string) []ShardID {
	var out []ShardID
	for s, id := range a {
		if id == runnerID {
			out = append(out, ShardID(s))
		}
	}
	return out
}

// Digest returns a 64-bit FNV-1a hash of the assignment: runners whose
// assignments have equal digests agree (up to a hash collision) without
// comparing every shard.
func (a Assignment) Digest() uint64 {
	h := uint64(fnvOffset64)
	for _, id := range a {
		for i := 0; i < len(id); i++ {
			h = (h ^ uint64(id[i])) * fnvPrime64
		}
		h = (h ^ 0xff) * fnvPrime64 // separator: ["ab" ""] differs from ["a" "b"]
	}
	return h
}

// Counts returns the number of shards assigned to each runner. Runners without
// shards and unassigned shards do not appear.
func (a Assignment) Counts() map[string]int {
	out := make(map[string]int)
	for _, id := range a {
		if id != "" {
			out[id]++
		}
	}
	return out
}

// Diff returns, in ascending order, the shards whose runner differs between
// from and to. It is meant for two assignments of the same length; a shard
// beyond the end of the shorter one counts as unassigned there.
func Diff(from, to Assignment) []ShardID {
	n := max(len(from), len(to))
	var out []ShardID
	for s := range n {
		var a, b string
		if s < len(from) {
			a = from[s]
		}
		if s < len(to) {
			b = to[s]
		}
		if a != b {
			out = append(out, ShardID(s))
		}
	}
	return out
}

// Input is everything a [Strategy] may look at.
type Input struct {
	// NumShards is the number of shards N; see [ValidateNumShards].
	NumShards int
	// Runners are the members, in any order: no strategy depends on it.
	Runners []Runner
	// Current holds the current owner of each shard ("" = unowned). It is
	// nil or has length NumShards. Only StickyBalanced reads it; the other
	// strategies depend on the runner set alone.
	Current Assignment
}

// member is a runner with weight > 0, prepared for the strategies.
type member struct {
	id     string
	weight int
	key    uint64 // runnerKey(id)
}

// members validates in and returns its runners with weight > 0 sorted by ID,
// the canonical order every strategy starts from, so that none depends on the
// order of in.Runners.
func members(in Input) ([]member, error) {
	if err := ValidateNumShards(in.NumShards); err != nil {
		return nil, err
	}
	if in.Current != nil && len(in.Current) != in.NumShards {
		return nil, fmt.Errorf("%w: %d shards, want %d", ErrInvalidCurrent, len(in.Current), in.NumShards)
	}
	ids := make([]string, 0, len(in.Runners))
	var ms []member
	for i, r := range in.Runners {
		if r.ID == "" {
			return nil, fmt.Errorf("runner %d: %w", i, ErrEmptyRunnerID)
		}
		if r.Weight < 0 || r.Weight > MaxWeight {
			return nil, fmt.Errorf("runner %q: %w: %d (want 0..%d)", r.ID, ErrInvalidWeight, r.Weight, MaxWeight)
		}
		ids = append(ids, r.ID)
		if r.Weight > 0 {
			ms = append(ms, member{id: r.ID, weight: r.Weight, key: runnerKey(r.ID)})
		}
	}
	slices.Sort(ids)
	for i := 1; i < len(ids); i++ {
		if ids[i] == ids[i-1] {
			return nil, fmt.Errorf("runner %q: %w", ids[i], ErrDuplicateRunner)
		}
	}
	slices.SortFunc(ms, func(a, b member) int { return strings.Compare(a.id, b.id) })
	return ms, nil
}

// equalWeights reports whether all members have the same weight, in which
// case weighted rendezvous reduces to comparing hashes.
func equalWeights(ms []member) bool {
	for _, m := range ms {
		if m.weight != ms[0].weight {
			return false
		}
	}
	return true
}

// quotas returns each member's share of n shards by the largest-remainder
// method: floor(n*w/W), plus one for as many runners as needed to sum to n,
// so that every runner is within one shard of its exact proportional share
// n*w/W. The extra shards go to runners with a fractional share, ranked by
// prefer(i, floor of i) first when prefer is not nil, then by the largest
// remainder, then by runner key (descending) and ID. Ranking by runner key
// makes the chosen set nested: a joining runner does not reshuffle which of
// the others get an extra shard.
func quotas(ms []member, n int, prefer func(i, floor int) bool) []int {
	var total uint64
	for _, m := range ms {
		total += uint64(m.weight)
	}
	q := make([]int, len(ms))
	rem := make([]uint64, len(ms))
	order := make([]int, len(ms))
	assigned := 0
	for i, m := range ms {
		prod := uint64(n) * uint64(m.weight) // < 2^20 * 2^31: no overflow
		q[i] = int(prod / total)
		rem[i] = prod % total
		assigned += q[i]
		order[i] = i
	}
	extras := n - assigned // < len(ms)
	if extras == 0 {
		return q
	}
	slices.SortFunc(order, func(a, b int) int {
		if (rem[a] > 0) != (rem[b] > 0) {
			if rem[a] > 0 {
				return -1
			}
			return 1
		}
		if prefer != nil {
			if fa, fb := prefer(a, q[a]), prefer(b, q[b]); fa != fb {
				if fa {
					return -1
				}
				return 1
			}
		}
		switch {
		case rem[a] != rem[b]:
			if rem[a] > rem[b] {
				return -1
			}
			return 1
		case ms[a].key != ms[b].key:
			if ms[a].key > ms[b].key {
				return -1
			}
			return 1
		}
		return strings.Compare(ms[a].id, ms[b].id)
	})
	for _, i := range order[:extras] {
		q[i]++
	}
	return q
}

// unassigned returns an Assignment of n unassigned shards.
func unassigned(n int) Assignment { return make(Assignment, n) }
