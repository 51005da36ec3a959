package sharding

// Balanced returns the default strategy: rendezvous preferences with exact,
// capacity-bounded loads. It depends on the runner set alone (Input.Current
// is ignored), so every runner computes the same assignment from the same
// membership without coordination.
//
// Loads: each runner gets floor(N*w/W) or ceil(N*w/W) shards, where w is its
// weight and W the total weight, so it is within one shard of its exact
// proportional share; with equal weights the counts differ by at most one. A
// runner of weight 0 gets nothing.
//
// Assignment: the unique stable matching between shards and capacity-bounded
// runners when both rank each other by the weighted rendezvous score of
// [Rendezvous]: no shard and runner both prefer each other to what they got.
// Most shards go to their rendezvous winner, all but about 0.5*sqrt(N*M);
// the rest go to the best runner that still has room.
//
// Movement: when a runner joins or leaves, the shards that must move (the
// joiner's quota, the leaver's shards) move, plus a load correction of up to
// about sqrt(N) shards between the other runners (measured 0.25*sqrt(N) at
// M=3 up to 0.9*sqrt(N) at M=100): the price of exact loads that do not
// depend on history. Relative to the optimum that is small while N/M is large (1.06 at
// N=16384, M=10) and grows with M/sqrt(N) (1.7 at N=16384, M=100; 3.6 at
// N=1024, M=100). [StickyBalanced] moves only the necessary shards but
// depends on the current assignment.
func Balanced() Strategy { return balanced{} }

type balanced struct{}

func (balanced) Name() string { return nameBalanced }

// MembershipOnly implements [MembershipOnly]: Input.Current is ignored.
func (balanced) MembershipOnly() bool { return true }

func (s balanced) Assign(in Input) (Assignment, error) {
	ms, err := members(in)
	if err != nil {
		return nil, assignError(s, in, err)
	}
	if len(ms) == 0 {
		return unassigned(in.NumShards), nil
	}
	return stableMatch(ms, quotas(ms, in.NumShards, nil), in.NumShards), nil
}

// held is a shard provisionally held by a runner during stableMatch.
type held struct {
	key   uint64 // the pair's rank key
	shard int32
}

// worse reports whether the runner holding a and b prefers b: pairs rank by
// key, ties (hash collisions) by the lower shard.
func (a held) worse(b held) bool {
	if a.key != b.key {
		return a.key < b.key
	}
	return a.shard > b.shard
}

// stableMatch assigns n shards to the members, member i taking exactly q[i]
// shards (sum(q) == n), by deferred acceptance (Gale-Shapley) with shards
// proposing in their rendezvous order and each runner keeping the best q[i]
// proposals. Because shards and runners rank pairs by the same key, the
// stable matching is unique: the result does not depend on the order in
// which shards propose. It equals the greedy that walks all pairs from the
// best key down, assigning a pair when its shard is free and its runner has
// room.
//
// Cost: one pass over the members (M hashes) per proposal; almost all
// shards are accepted at their first or second proposal, so about 1.2*N*M
// hashes in total.
func stableMatch(ms []member, q []int, n int) Assignment {
	r := newRanking(ms)
	// The pair each shard proposed to last: its key and member (-1: none).
	lastKey := make([]uint64, n)
	lastIdx := make([]int32, n)
	for s := range lastIdx {
		lastIdx[s] = -1
	}
	heaps := make([]held, n)
	off := acceptProposals(q, heaps, func(s int32) (int, uint64) {
		// The best member ranked below the last one s proposed to.
		best, bk := r.best(shardKey(int(s)), q, int(lastIdx[s]), lastKey[s])
		lastIdx[s], lastKey[s] = int32(best), bk
		return best, bk
	})
	out := make(Assignment, n)
	for i, mb := range ms {
		for _, p := range heaps[off[i]:off[i+1]] {
			out[p.shard] = mb.id
		}
	}
	return out
}

// acceptProposals runs deferred acceptance for len(heaps) shards, member i
// keeping the best q[i] proposals; next(s) returns the member shard s
// proposes to next, in the shard's order, and the pair's rank key. Member
// i's shards end in heaps[off[i]:off[i+1]].
func acceptProposals(q []int, heaps []held, next func(s int32) (int, uint64)) (off []int) {
	m := len(q)
	// Member i's held shards form a min-heap (worst on top) in
	// heaps[off[i] : off[i]+size[i]], with room for q[i].
	off = make([]int, m+1)
	for i := range m {
		off[i+1] = off[i] + q[i]
	}
	size := make([]int, m)
	for s := range heaps {
		cur := int32(s) // the shard that proposes next; -1 when all are held
		for cur >= 0 {
			best, bk := next(cur)
			if best < 0 {
				// Unreachable: sum(q) == n, so some member always has room
				// for or prefers a shard that was rejected everywhere else.
				panic("sharding: stable matching ran out of runners")
			}
			h := heaps[off[best] : off[best]+q[best]]
			p := held{key: bk, shard: cur}
			switch {
			case size[best] < q[best]:
				h[size[best]] = p
				siftUp(h, size[best])
				size[best]++
				cur = -1
			case h[0].worse(p):
				cur = h[0].shard // displaced: proposes again
				h[0] = p
				siftDown(h, 0)
			default:
				// Rejected: cur proposes to its next choice.
			}
		}
	}
	return off
}

// siftUp restores the min-heap order of h after h[i] was set.
func siftUp(h []held, i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h[i].worse(h[parent]) {
			return
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

// siftDown restores the min-heap order of h after h[i] was replaced.
func siftDown(h []held, i int) {
	for {
		least := i
		if l := 2*i + 1; l < len(h) && h[l].worse(h[least]) {
			least = l
		}
		if r := 2*i + 2; r < len(h) && h[r].worse(h[least]) {
			least = r
		}
		if least == i {
			return
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
}
