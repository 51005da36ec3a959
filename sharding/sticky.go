package sharding

import (
	"container/heap"
	"slices"
)

// StickyBalanced returns the strategy that balances like [Balanced] while
// moving as few shards as possible from Input.Current:
//
//  1. Every shard whose current owner is a runner with weight > 0 stays
//     with it, unless that runner is above its quota (3).
//  2. Quotas are as in Balanced (floor or ceil of N*w/W); the runners that
//     get the ceiling are chosen, among those entitled to it, preferring
//     the ones that already hold more than the floor.
//  3. A runner above its quota releases its excess shards, those it ranks
//     lowest by rendezvous hash.
//  4. Orphans (unowned shards, shards of gone or draining runners, released
//     shards) are handed out in ascending shard order, each to the runner
//     furthest below its quota (ties to the smaller ID).
//
// The number of shards that change owner is the minimum any assignment with
// these loads can achieve; when Current is nil or empty it degenerates to a
// round-robin deal. Unlike Balanced, the result depends on history: two
// runners that see different Current values compute different assignments.
func StickyBalanced() Strategy { return stickyBalanced{} }

type stickyBalanced struct{}

func (stickyBalanced) Name() string { return nameStickyBalanced }

func (s stickyBalanced) Assign(in Input) (Assignment, error) {
	ms, err := members(in)
	if err != nil {
		return nil, assignError(s, in, err)
	}
	n := in.NumShards
	if len(ms) == 0 {
		return unassigned(n), nil
	}
	index := make(map[string]int, len(ms))
	for i, m := range ms {
		index[m.id] = i
	}
	kept := make([][]int32, len(ms)) // ascending
	var orphans []int32
	for sh := range n {
		if in.Current != nil {
			if i, ok := index[in.Current[sh]]; ok {
				kept[i] = append(kept[i], int32(sh))
				continue
			}
		}
		orphans = append(orphans, int32(sh))
	}
	q := quotas(ms, n, func(i, floor int) bool { return len(kept[i]) > floor })

	released := false
	for i, m := range ms {
		if len(kept[i]) <= q[i] {
			continue
		}
		// Keep the q[i] shards the runner ranks highest.
		slices.SortFunc(kept[i], func(a, b int32) int {
			ha, hb := pairHash(m.key, shardKey(int(a))), pairHash(m.key, shardKey(int(b)))
			switch {
			case ha > hb:
				return -1
			case ha < hb:
				return 1
			}
			return 0 // unreachable: pairHash is injective in the shard
		})
		orphans = append(orphans, kept[i][q[i]:]...)
		kept[i] = kept[i][:q[i]]
		released = true
	}
	if released {
		slices.Sort(orphans)
	}

	out := make(Assignment, n)
	need := &deficits{}
	for i, m := range ms {
		for _, sh := range kept[i] {
			out[sh] = m.id
		}
		if d := q[i] - len(kept[i]); d > 0 {
			need.items = append(need.items, deficit{member: i, need: d})
		}
	}
	heap.Init(need)
	for _, sh := range orphans {
		top := &need.items[0]
		out[sh] = ms[top.member].id
		if top.need--; top.need == 0 {
			heap.Pop(need)
		} else {
			heap.Fix(need, 0)
		}
	}
	return out, nil
}

// deficit is a runner's number of shards still missing to its quota.
type deficit struct {
	member int // index into the ID-sorted members
	need   int
}

// deficits is a heap with the largest need (ties: smallest member) on top.
type deficits struct{ items []deficit }

func (d *deficits) Len() int { return len(d.items) }
func (d *deficits) Less(i, j int) bool {
	a, b := d.items[i], d.items[j]
	if a.need != b.need {
		return a.need > b.need
	}
	return a.member < b.member
}
func (d *deficits) Swap(i, j int) { d.items[i], d.items[j] = d.items[j], d.items[i] }
func (d *deficits) Push(x any)    { d.items = append(d.items, x.(deficit)) }
func (d *deficits) Pop() any {
	last := d.items[len(d.items)-1]
	d.items = d.items[:len(d.items)-1]
	return last
}
