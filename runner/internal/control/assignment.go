package control

import (
	"iter"
	"slices"

	"github.com/shardhost/shardhost/sharding"
)

// Assignment is a sharding.Assignment kept as indexes into its distinct
// runner IDs: 1 byte a shard with up to 256 of them, else 2, instead of a
// string's 16 (a strategy's Assignment has at most NumShards <=
// sharding.MaxShards distinct values, so a uint16 always indexes them).
// The zero value is no assignment (Known false). It is immutable: runners
// share it.
type Assignment struct {
	names []string // the distinct IDs, in the order of their first shard
	// By shard, an index into names: narrow with up to 256 names, else
	// wide (the other is nil).
	narrow []uint8
	wide   []uint16
}

// CompactAssignment returns a as an Assignment (none when a is nil).
func CompactAssignment(a sharding.Assignment) Assignment {
	if a == nil {
		return Assignment{}
	}
	wide := make([]uint16, len(a))
	at := map[string]uint16{}
	var names []string
	for s, id := range a {
		i, ok := at[id]
		if !ok {
			i = uint16(len(names))
			at[id] = i
			names = append(names, id)
		}
		wide[s] = i
	}
	c := Assignment{names: slices.Clip(names), wide: wide}
	if len(names) <= 1<<8 {
		c.narrow, c.wide = make([]uint8, len(a)), nil
		for s, i := range wide {
			c.narrow[s] = uint8(i)
		}
	}
	return c
}

// index returns shard s's index into a.names (s < a.Len()).
func (a Assignment) index(s int) uint16 {
	if a.narrow != nil {
		return uint16(a.narrow[s])
	}
	return a.wide[s]
}

// Known reports whether a is an assignment (not the zero value).
func (a Assignment) Known() bool { return a.narrow != nil || a.wide != nil }

// Len returns the number of shards a assigns.
func (a Assignment) Len() int { return len(a.narrow) + len(a.wide) }

// Of returns the runner shard id is assigned to: "" when it is
// unassigned or beyond the assignment.
func (a Assignment) Of(id sharding.ShardID) string {
	if int(id) >= a.Len() {
		return ""
	}
	return a.names[a.index(int(id))]
}

// Count returns how many shards a assigns to runner id: O(shards).
func (a Assignment) Count(id string) int {
	k := slices.Index(a.names, id)
	if k < 0 {
		return 0
	}
	n := 0
	for s := range a.Len() {
		if int(a.index(s)) == k {
			n++
		}
	}
	return n
}

// Equal reports whether a and b assign every shard alike (both unknown,
// or both known and equal).
func (a Assignment) Equal(b Assignment) bool {
	// The names are in the order of their first shard: equal
	// assignments have equal tables.
	return a.Known() == b.Known() && slices.Equal(a.names, b.names) &&
		slices.Equal(a.narrow, b.narrow) && slices.Equal(a.wide, b.wide)
}

// All yields each shard and the runner it is assigned to ("": none), in
// shard order.
func (a Assignment) All() iter.Seq2[sharding.ShardID, string] {
	return func(yield func(sharding.ShardID, string) bool) {
		for s := range a.Len() {
			if !yield(sharding.ShardID(s), a.names[a.index(s)]) {
				return
			}
		}
	}
}

// Expand returns a as a sharding.Assignment (nil when unknown), the
// caller's.
func (a Assignment) Expand() sharding.Assignment {
	if !a.Known() {
		return nil
	}
	out := make(sharding.Assignment, a.Len())
	for s := range out {
		out[s] = a.names[a.index(s)]
	}
	return out
}
