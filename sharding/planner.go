package sharding

import (
	"math"
	"slices"
	"strings"
	"sync"
)

// prefixLen is how many of its best-ranked runners a [Planner] keeps per
// shard. Almost every shard is accepted at its first or second proposal;
// a shard that is rejected by all of them ranks the others on the spot.
const prefixLen = 4

// maxSlots is the most runners a Planner keeps prefixes for (a slot is a
// uint16, and noSlot ends a short prefix); with more, it computes each
// assignment afresh.
const maxSlots = noSlot

// Planner computes a sequence of assignments with one strategy — a
// runner's view of the membership as it changes — reusing what it computed
// for the previous input. Every result is exactly the strategy's Assign of
// the same input.
//
// For [Balanced] a Planner keeps, for every shard, the few runners that
// rank it highest (a prefix of the shard's rendezvous order: 4 bytes a
// shard while the runners it has seen fit in 255 slots, 8 bytes with up to
// 65 535; with more it computes afresh). An input
// whose runners differ from the previous one's by a few runners — a join, a
// departure, a weight change, a runner draining (weight 0) — costs
// O(NumShards) hashes per runner that changed to update those prefixes,
// plus one pass of deferred acceptance that reads them: about O(NumShards)
// in all, where a fresh Assign costs O(NumShards x runners) hashes. The
// first input, and one that changes more than half the runners, is
// computed as a fresh Assign; the prefixes are built (about twice that)
// by Prepare, or else at the first small change after it. An input with the previous one's
// runners and weights returns the previous assignment (kept a byte a
// shard with up to 255 runners, two with up to 65 535). Other strategies
// are called as they are.
//
// A Planner is safe for concurrent use; its calls are serialized.
type Planner struct {
	s        Strategy
	balanced bool

	mu sync.Mutex
	n  int      // NumShards of the last match
	eq bool     // the rank keys are pair hashes (equal weights)
	ms []member // the runners of the last match (and of the prefixes), sorted by ID
	// Slots name the runners in the prefixes; a departed runner's slot
	// is reused once its entries are gone. At most maxSlots.
	slotOf  map[string]int32
	slotID  []string  // by slot; "" when free
	slotKey []uint64  // by slot: the runner's key (member.key)
	slotW   []float64 // by slot: its weight
	// The shards' prefixes (none kept while !pre.kept()): the true start
	// of each shard's order over ms (rank key descending, then ID
	// ascending; the rank keys are hashed again when read: rankKey). A
	// prefix holds every runner of ms when its length is len(ms).
	pre indexes
	// matched: there was a match, of ms; last is its result, each shard's
	// member as an index into ms (none with more than maxSlots members):
	// a repeated input — a runner's record rewritten, a drained runner's
	// record deleted — returns it without a match.
	matched bool
	last    indexes
}

// rankBatchFrom is the most runners for which a shard past its prefix
// ranks its next runner one proposal at a time (BenchmarkPlanner: batches
// cost 8-15 % more at 65 536 x 100, and save 61 % at 65 536 x 1 000).
const rankBatchFrom = 256

// noSlot marks the end of a prefix shorter than prefixLen.
const noSlot = 1<<16 - 1

// indexes is a table of small indexes (slots, members), each noSlot until
// set: one byte an entry while every index written is below 255 (0xff
// stands for noSlot there), two bytes after the first larger one. The
// zero value is no table. As the Planner's prefixes, shard s's prefix is
// entries s*prefixLen to s*prefixLen+prefixLen-1, best first, a shorter
// one ended by noSlot.
type indexes struct {
	narrow []uint8
	wide   []uint16
}

// newIndexes returns a table of n entries for indexes below below.
func newIndexes(n, below int) indexes {
	if below <= 0xff {
		b := make([]uint8, n)
		for i := range b {
			b[i] = 0xff
		}
		return indexes{narrow: b}
	}
	w := make([]uint16, n)
	for i := range w {
		w[i] = noSlot
	}
	return indexes{wide: w}
}

func (t *indexes) kept() bool { return t.narrow != nil || t.wide != nil }

func (t *indexes) len() int { return len(t.narrow) + len(t.wide) }

// at returns entry i: a slot, or noSlot.
func (t *indexes) at(i int) uint16 {
	if t.narrow != nil {
		if v := t.narrow[i]; v != 0xff {
			return uint16(v)
		}
		return noSlot
	}
	return t.wide[i]
}

// set makes entry i v (an index, or noSlot); an index of 255 or more
// first widens a narrow table.
func (t *indexes) set(i int, v uint16) {
	if t.narrow == nil {
		t.wide[i] = v
		return
	}
	if v == noSlot {
		t.narrow[i] = 0xff
		return
	}
	if v >= 0xff {
		t.wide = make([]uint16, len(t.narrow))
		for j, b := range t.narrow {
			t.wide[j] = noSlot
			if b != 0xff {
				t.wide[j] = uint16(b)
			}
		}
		t.narrow = nil
		t.wide[i] = v
		return
	}
	t.narrow[i] = uint8(v)
}

// length returns the length of shard s's prefix.
func (t *indexes) length(s int) int {
	base := s * prefixLen
	if t.narrow != nil {
		return prefixLength(t.narrow[base:base+prefixLen], 0xff)
	}
	return prefixLength(t.wide[base:base+prefixLen], noSlot)
}

// remove takes slot out of the first n prefixes.
func (t *indexes) remove(n int, slot uint16) {
	if t.narrow != nil {
		removeSlot(t.narrow, n, uint8(slot), 0xff)
		return
	}
	removeSlot(t.wide, n, slot, noSlot)
}

// prefixLength returns the length of prefix p, ended by none.
func prefixLength[T uint8 | uint16](p []T, none T) int {
	for j, e := range p {
		if e == none {
			return j
		}
	}
	return len(p)
}

// removeSlot takes slot out of the first n prefixes of tab, ended by none.
func removeSlot[T uint8 | uint16](tab []T, n int, slot, none T) {
	for base := 0; base < n*prefixLen; base += prefixLen {
		p := tab[base : base+prefixLen]
		for j, e := range p {
			if e == none {
				break
			}
			if e == slot {
				copy(p[j:], p[j+1:])
				p[prefixLen-1] = none
				break
			}
		}
	}
}

// NewPlanner returns a Planner computing the assignments of s.
func NewPlanner(s Strategy) *Planner {
	_, ok := s.(balanced)
	return &Planner{s: s, balanced: ok}
}

// Prepare builds the prefixes for the last input, when a fresh
// computation (the first input, or a change of more than half the
// runners) left none, so that the next small change costs O(NumShards)
// instead of a rebuild. It costs about twice a fresh Assign, computed
// without holding up Assign (the result is dropped if an Assign came
// meanwhile): call it once membership is quiet. It does nothing for other
// strategies.
func (p *Planner) Prepare() {
	if !p.balanced {
		return
	}
	p.mu.Lock()
	n, ms, eq := p.n, p.ms, p.eq // p.ms is replaced, never written
	todo := p.matched && !p.pre.kept() && len(ms) > 0 && len(ms) <= maxSlots
	p.mu.Unlock()
	if !todo {
		return
	}
	var b Planner
	b.rebuild(n, ms, eq)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pre.kept() || p.n != n || p.eq != eq || !slices.Equal(p.ms, ms) {
		return
	}
	p.slotOf, p.slotID, p.slotKey, p.slotW, p.pre = b.slotOf, b.slotID, b.slotKey, b.slotW, b.pre
}

// Prepared reports whether the next small change costs O(NumShards):
// the prefixes are kept (or the strategy is not Balanced, or there is no
// input yet, or too many runners for prefixes: Prepare would do nothing).
func (p *Planner) Prepared() bool {
	if !p.balanced {
		return true
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return !p.matched || p.pre.kept() || len(p.ms) == 0 || len(p.ms) > maxSlots
}

// Strategy returns the strategy p computes the assignments of.
func (p *Planner) Strategy() Strategy { return p.s }

// Assign returns the strategy's assignment for in (see [Strategy.Assign]).
// The result is the caller's.
func (p *Planner) Assign(in Input) (Assignment, error) {
	if !p.balanced {
		return p.s.Assign(in)
	}
	ms, err := members(in)
	if err != nil {
		return nil, assignError(p.s, in, err)
	}
	if len(ms) == 0 {
		return unassigned(in.NumShards), nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	eq := equalWeights(ms)
	if p.n == in.NumShards && p.eq == eq && slices.Equal(p.ms, ms) && p.matched {
		if p.last.len() != p.n {
			return p.match(quotas(ms, in.NumShards, nil)), nil
		}
		out := make(Assignment, p.n)
		for s := range out {
			out[s] = p.ms[p.last.at(s)].id
		}
		return out, nil
	}
	gone, added := diffMembers(p.ms, ms, eq)
	small := p.matched && p.n == in.NumShards && p.eq == eq && len(gone)+len(added) <= len(ms)/2+1 &&
		len(ms) <= maxSlots && len(p.ms) <= maxSlots
	switch {
	case small && p.pre.kept() && p.update(ms, gone, added):
	case small:
		// Membership changes one runner at a time from here on: worth
		// the prefixes (about twice a fresh Assign, once).
		p.rebuild(in.NumShards, ms, eq)
	default:
		// A first assignment or many runners at once (a cold start):
		// prefixes might be rebuilt for nothing; ranked on the spot.
		p.n, p.eq, p.ms = in.NumShards, eq, slices.Clone(ms)
		p.pre, p.slotOf, p.slotID, p.slotKey, p.slotW = indexes{}, nil, nil, nil, nil
	}
	return p.match(quotas(ms, in.NumShards, nil)), nil
}

// diffMembers returns the runners of old that are not in ms and those of
// ms that are not in old (both sorted by ID); with unequal weights, a
// runner whose weight changed is in both.
func diffMembers(old, ms []member, eq bool) (gone, added []member) {
	i, j := 0, 0
	for i < len(old) || j < len(ms) {
		switch {
		case j == len(ms) || i < len(old) && old[i].id < ms[j].id:
			gone = append(gone, old[i])
			i++
		case i == len(old) || ms[j].id < old[i].id:
			added = append(added, ms[j])
			j++
		default:
			// The rank keys of a runner depend on its weight only when
			// the weights differ.
			if !eq && old[i].weight != ms[j].weight {
				gone = append(gone, old[i])
				added = append(added, ms[j])
			}
			i++
			j++
		}
	}
	return gone, added
}

// update brings the prefixes from p.ms to ms by removing the runners gone
// and adding the runners added. It reports false when the prefixes are
// worn down by removals: a rebuild is due.
func (p *Planner) update(ms, gone, added []member) bool {
	for _, m := range gone {
		p.remove(m.id)
	}
	present := len(p.ms) - len(gone) // the runners the prefixes rank
	p.ms = slices.Clone(ms)
	for _, m := range added {
		p.add(m, present)
		present++
	}
	// A removal shortens the prefixes that held the runner, and a shard
	// rejected by its whole prefix ranks every runner on the spot:
	// rebuild once the prefixes lack half an entry each on average.
	missing, want := 0, min(prefixLen, len(ms))
	for s := range p.n {
		missing += want - p.pre.length(s)
	}
	return missing <= p.n/2
}

// rebuild ranks every runner of ms for every shard and keeps the best
// prefixLen: O(n x len(ms)) hashes.
func (p *Planner) rebuild(n int, ms []member, eq bool) {
	p.n, p.eq, p.ms = n, eq, slices.Clone(ms)
	p.slotOf = make(map[string]int32, len(ms))
	p.slotID, p.slotKey, p.slotW = p.slotID[:0], p.slotKey[:0], p.slotW[:0]
	for _, m := range ms {
		p.slotOf[m.id] = int32(len(p.slotID))
		p.slotID = append(p.slotID, m.id)
		p.slotKey = append(p.slotKey, m.key)
		p.slotW = append(p.slotW, float64(m.weight))
	}
	p.pre = newIndexes(n*prefixLen, len(ms))
	rk := newRanking(ms)
	for s := range n {
		// The shard's prefix is built in a local array, the worst entry
		// (the bar to enter) kept at hand: most runners fail it.
		var keys [prefixLen]uint64
		var slots [prefixLen]uint16
		l, bar := 0, uint64(0)
		sk := shardKey(s)
		for i, m := range ms {
			h := pairHash(m.key, sk)
			k := h
			if !eq {
				w := rk.weights[i]
				// Skip, without the logarithm, runners that cannot enter
				// the prefix (as ranking.best does).
				if l == prefixLen && float64(w/(1-unitVariate(h)))*(1+1e-9) < math.Float64frombits(bar) {
					continue
				}
				k = math.Float64bits(weightedScore(h, w))
			}
			// Members come in ID order: an equal key ranks below.
			if l == prefixLen && k <= bar {
				continue
			}
			j := min(l, prefixLen-1)
			for j > 0 && k > keys[j-1] {
				keys[j], slots[j] = keys[j-1], slots[j-1]
				j--
			}
			keys[j], slots[j] = k, uint16(i)
			l = min(l+1, prefixLen)
			bar = keys[l-1]
		}
		for j, slot := range slots[:l] {
			p.pre.set(s*prefixLen+j, slot)
		}
	}
}

// add enters runner m into the prefixes it belongs to; they rank present
// runners so far.
func (p *Planner) add(m member, present int) {
	var slot int32
	if k := slices.Index(p.slotID, ""); k >= 0 {
		slot = int32(k)
		p.slotID[k], p.slotKey[k], p.slotW[k] = m.id, m.key, float64(m.weight)
	} else {
		slot = int32(len(p.slotID))
		p.slotID = append(p.slotID, m.id)
		p.slotKey = append(p.slotKey, m.key)
		p.slotW = append(p.slotW, float64(m.weight))
	}
	p.slotOf[m.id] = slot
	for s := range p.n {
		// A prefix that held every other runner holds the newcomer too.
		complete := p.pre.length(s) == present
		p.insert(s, p.rankKey(uint16(slot), s), uint16(slot), complete)
	}
}

// remove takes runner id out of every prefix and frees its slot.
func (p *Planner) remove(id string) {
	slot := p.slotOf[id]
	delete(p.slotOf, id)
	p.slotID[slot] = ""
	p.pre.remove(p.n, uint16(slot))
}

// insert puts (key, slot) into shard s's prefix at its rank. Below the
// last entry it goes only when the prefix is complete (holds every other
// runner): otherwise an unknown runner may rank between them.
func (p *Planner) insert(s int, key uint64, slot uint16, complete bool) {
	base, l := s*prefixLen, p.pre.length(s)
	j := l
	for j > 0 && p.above(key, slot, p.rankKey(p.pre.at(base+j-1), s), p.pre.at(base+j-1)) {
		j--
	}
	if j == l && (l == prefixLen || !complete) {
		return
	}
	// Shift the entries below j down one (the last falls off a full
	// prefix).
	for k := min(l, prefixLen-1); k > j; k-- {
		p.pre.set(base+k, p.pre.at(base+k-1))
	}
	p.pre.set(base+j, slot)
}

// above reports whether the pair (key a, runner slot sa) ranks above (b,
// sb): a higher key, or the same key and a smaller ID (ranking's order).
func (p *Planner) above(a uint64, sa uint16, b uint64, sb uint16) bool {
	if a != b {
		return a > b
	}
	return strings.Compare(p.slotID[sa], p.slotID[sb]) < 0
}

// rankKey returns the rank key of the runner in slot for shard s (as
// ranking.key computes it).
func (p *Planner) rankKey(slot uint16, s int) uint64 {
	h := pairHash(p.slotKey[slot], shardKey(s))
	if p.eq {
		return h
	}
	return math.Float64bits(weightedScore(h, p.slotW[slot]))
}

// match is stableMatch reading the prefixes: a shard proposes to its
// prefix's runners in order and ranks the others on the spot only when
// all of those rejected it. It returns the assignment of p.ms.
func (p *Planner) match(q []int) Assignment {
	n := p.n
	idx := make([]int32, len(p.slotID)) // slot -> index in p.ms
	kept := p.pre.kept()
	for i, m := range p.ms {
		if kept {
			idx[p.slotOf[m.id]] = int32(i)
		}
	}
	r := newRanking(p.ms)
	// The scratch of one match (29 bytes a shard) is not kept: a Planner
	// lives as long as its runner and matches only when membership
	// changes.
	heaps, next := make([]held, n), make([]uint8, n)
	lastKey, lastIdx := make([]uint64, n), make([]int32, n)
	for s := range lastIdx {
		lastIdx[s] = -1
	}
	// By shard, its next runners past the prefix, ranked (allocated at
	// the first shard that needs them).
	var (
		arena      []rankedMember
		pbeg, pend []int32
		pbatch     []uint8
	)
	off := acceptProposals(q, heaps, func(s int32) (int, uint64) {
		base := int(s) * prefixLen
		for kept && int(next[s]) < prefixLen {
			slot := p.pre.at(base + int(next[s]))
			if slot == noSlot {
				break
			}
			next[s]++
			if i := idx[slot]; q[i] > 0 {
				k := p.rankKey(slot, int(s))
				lastIdx[s], lastKey[s] = i, k
				return int(i), k
			}
		}
		// Past its prefix: the shard's next runner, ranked on the spot;
		// with many runners a shard may propose to dozens, so there they
		// are ranked a batch at a time, each batch twice the last (one
		// pass over the runners for several proposals):
		// arena[pbeg[s]:pend[s]].
		if pend == nil && len(p.ms) > rankBatchFrom {
			pbeg, pend, pbatch = make([]int32, n), make([]int32, n), make([]uint8, n)
		}
		if pend == nil || pbatch[s] == 0 {
			// The first past the prefix (most shards stop there): one.
			if pend != nil {
				pbatch[s] = 1
			}
			best, bk := r.best(shardKey(int(s)), q, int(lastIdx[s]), lastKey[s])
			lastIdx[s], lastKey[s] = int32(best), bk
			return best, bk
		}
		if pbeg[s] == pend[s] {
			k := min(2*int(pbatch[s]), maxRankBatch)
			start := len(arena)
			arena = r.bestBelow(shardKey(int(s)), q, int(lastIdx[s]), lastKey[s], k, arena)
			if len(arena) == start {
				return -1, 0
			}
			pbeg[s], pend[s], pbatch[s] = int32(start), int32(len(arena)), uint8(k)
		}
		m := arena[pbeg[s]]
		pbeg[s]++
		lastIdx[s], lastKey[s] = m.i, m.key
		return int(m.i), m.key
	})
	out := make(Assignment, n)
	p.last = indexes{}
	if len(p.ms) <= maxSlots {
		p.last = newIndexes(n, len(p.ms))
	}
	for i, m := range p.ms {
		for _, h := range heaps[off[i]:off[i+1]] {
			out[h.shard] = m.id
			if p.last.kept() {
				p.last.set(int(h.shard), uint16(i))
			}
		}
	}
	p.matched = true
	return out
}
