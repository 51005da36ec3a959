package sharding

import (
	"fmt"
	"math"
)

// Strategy computes which runner each shard is assigned to.
//
// Implementations are deterministic: the same Input, with its runners in any
// order, yields the same Assignment on every platform. They are safe for
// concurrent use and return an Assignment of length Input.NumShards in which
// every shard is assigned to a runner with weight > 0, or, when there is no
// such runner, all shards are unassigned (""). Assign returns an error,
// matching one of the package's Err values, for an invalid Input.
type Strategy interface {
	// Name returns the strategy's name as accepted by StrategyByName.
	Name() string
	// Assign computes the assignment for in.
	Assign(in Input) (Assignment, error)
}

// MembershipOnly is implemented by strategies whose assignment depends on
// NumShards and Input.Runners alone, never on Input.Current (Rendezvous,
// Balanced, JumpHash): a caller may keep an assignment while the runner
// set and weights are unchanged, and need not build Current.
type MembershipOnly interface {
	Strategy
	// MembershipOnly reports whether Assign ignores Input.Current.
	MembershipOnly() bool
}

// IgnoresCurrent reports whether s implements MembershipOnly and says so.
func IgnoresCurrent(s Strategy) bool {
	m, ok := s.(MembershipOnly)
	return ok && m.MembershipOnly()
}

// Strategy names, as accepted by [StrategyByName].
const (
	nameRendezvous     = "rendezvous"
	nameBalanced       = "balanced"
	nameStickyBalanced = "sticky-balanced"
	nameJumpHash       = "jump-hash"
)

// Default returns the strategy used when none is configured: [Balanced].
func Default() Strategy { return Balanced() }

// StrategyByName returns the strategy whose Name is name: "rendezvous",
// "balanced", "sticky-balanced" or "jump-hash". Other names yield
// [ErrUnknownStrategy].
func StrategyByName(name string) (Strategy, error) {
	switch name {
	case nameRendezvous:
		return Rendezvous(), nil
	case nameBalanced:
		return Balanced(), nil
	case nameStickyBalanced:
		return StickyBalanced(), nil
	case nameJumpHash:
		return JumpHash(), nil
	}
	return nil, fmt.Errorf("%w: %q (want %q, %q, %q or %q)", ErrUnknownStrategy, name,
		nameRendezvous, nameBalanced, nameStickyBalanced, nameJumpHash)
}

// assignError wraps an Input validation error with the operation.
func assignError(s Strategy, in Input, err error) error {
	return fmt.Errorf("assign %d shards (%s): %w", in.NumShards, s.Name(), err)
}

// ranking orders the members for each shard by weighted rendezvous: a shard
// prefers the member with the highest rank key. Keys are compared as
// uint64; ties (which need a 64-bit hash collision) go to the lower member
// index, i.e. the smaller ID.
type ranking struct {
	keys    []uint64  // runnerKey of each member
	weights []float64 // nil when all weights are equal
}

func newRanking(ms []member) ranking {
	r := ranking{keys: make([]uint64, len(ms))}
	for i, m := range ms {
		r.keys[i] = m.key
	}
	if !equalWeights(ms) {
		r.weights = make([]float64, len(ms))
		for i, m := range ms {
			r.weights[i] = float64(m.weight)
		}
	}
	return r
}

// key returns the rank key of member i for the shard with key sk. With equal
// weights it is the pair hash itself, which orders like the weighted score;
// otherwise it is the bit pattern of the (positive) weighted score.
func (r ranking) key(i int, sk uint64) uint64 {
	h := pairHash(r.keys[i], sk)
	if r.weights == nil {
		return h
	}
	return math.Float64bits(weightedScore(h, r.weights[i]))
}

// best returns the member with the highest rank key for the shard with key
// sk, and that key, among the members i with room[i] > 0 (all members if
// room is nil) that rank below member last with key lastKey (all of them
// if last < 0). It returns -1 if there is no such member.
func (r ranking) best(sk uint64, room []int, last int, lastKey uint64) (int, uint64) {
	// below reports whether key k of member i ranks below the last one.
	below := func(i int, k uint64) bool { return last < 0 || k < lastKey || k == lastKey && i > last }
	best, bestKey := -1, uint64(0)
	if r.weights == nil {
		for i, rk := range r.keys {
			if room != nil && room[i] == 0 {
				continue
			}
			if k := pairHash(rk, sk); (best < 0 || k > bestKey) && below(i, k) {
				best, bestKey = i, k
			}
		}
		return best, bestKey
	}
	bestScore := 0.0
	for i, rk := range r.keys {
		if room != nil && room[i] == 0 {
			continue
		}
		h := pairHash(rk, sk)
		w := r.weights[i]
		// Skip, without the logarithm, members that cannot beat the best
		// so far: their score w / -ln(u) is at most w / (1-u). The margin
		// covers the rounding of both sides, so skipping changes nothing.
		if best >= 0 {
			u := unitVariate(h)
			if bound := float64(w/(1-u)) * (1 + 1e-9); bound < bestScore {
				continue
			}
		}
		score := weightedScore(h, w)
		if k := math.Float64bits(score); (best < 0 || k > bestKey) && below(i, k) {
			best, bestKey, bestScore = i, k, score
		}
	}
	return best, bestKey
}

// maxRankBatch bounds the runners ranking.bestBelow returns at once.
const maxRankBatch = 64

// rankedMember is a member and its rank key for a shard.
type rankedMember struct {
	i   int32
	key uint64
}

// bestBelow appends to out, best first, up to k members as
// ranking.best returns them one after the other from (last, lastKey):
// with room, ranking below the last one (all if last < 0), by rank key
// descending, then index ascending. One pass over the members. (best is
// not written as bestBelow with k = 1: that made Assign 30-40 % slower.)
func (r ranking) bestBelow(sk uint64, room []int, last int, lastKey uint64, k int, out []rankedMember) []rankedMember {
	below := func(i int, k uint64) bool { return last < 0 || k < lastKey || k == lastKey && i > last }
	// out[base:] is kept sorted; a candidate enters if it ranks above its
	// last entry (or it is not full). Members come in index order: on an
	// equal key the one already there ranks first.
	base := len(out)
	for i, rk := range r.keys {
		if room != nil && room[i] == 0 {
			continue
		}
		var key uint64
		if r.weights == nil {
			key = pairHash(rk, sk)
		} else {
			key = math.Float64bits(weightedScore(pairHash(rk, sk), r.weights[i]))
		}
		if len(out)-base == k && key <= out[len(out)-1].key || !below(i, key) {
			continue
		}
		j := len(out)
		if j-base < k {
			out = append(out, rankedMember{})
		} else {
			j = len(out) - 1
		}
		for j > base && key > out[j-1].key {
			out[j] = out[j-1]
			j--
		}
		out[j] = rankedMember{int32(i), key}
	}
	return out
}

// Rendezvous returns the weighted rendezvous (highest random weight) strategy:
// each shard goes to the runner with the highest score w / -ln(u), where u in
// (0, 1) is a hash of the pair (runner, shard). A runner gets each shard with
// probability weight / total weight, so loads vary binomially (about ±sqrt of
// the mean); only the shards of a leaving runner move, and a joining runner
// takes only shards it wins. Input.Current is ignored.
func Rendezvous() Strategy { return rendezvous{} }

type rendezvous struct{}

func (rendezvous) Name() string { return nameRendezvous }

// MembershipOnly implements [MembershipOnly]: Input.Current is ignored.
func (rendezvous) MembershipOnly() bool { return true }

func (s rendezvous) Assign(in Input) (Assignment, error) {
	ms, err := members(in)
	if err != nil {
		return nil, assignError(s, in, err)
	}
	out := unassigned(in.NumShards)
	if len(ms) == 0 {
		return out, nil
	}
	r := newRanking(ms)
	for sh := range out {
		best, _ := r.best(shardKey(sh), nil, -1, 0)
		out[sh] = ms[best].id
	}
	return out, nil
}
