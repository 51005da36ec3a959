package control

import (
	"iter"
	"slices"

	"github.com/shardhost/shardhost/sharding"
)

// Assignment is a sharding.Assignment kept as indexes into its distinct
// runner IDs: 2 bytes a shard instead of a string's 16 (a strategy's
// Assignment has at most NumShards <= sharding.MaxShards distinct
// values, so a uint16 always indexes them). The zero value is no
// assignment (Known false). It is immutable: runners share it.
type Assignment struct {
	names []string // the distinct IDs, in the order of their first shard
	idx   []uint16 // by shard: an index into names
}

// CompactAssignment returns a as an Assignment (none when a is nil).
func CompactAssignment(a sharding.Assignment) Assignment {
	if a == nil {
		return Assignment{}
	}
	c := Assignment{idx: make([]uint16, len(a))}
	at := map[string]uint16{}
	for s, id := range a {
		i, ok := at[id]
		if !ok {
			i = uint16(len(c.names))
			at[id] = i
			c.names = append(c.names, id)
		}
		c.idx[s] = i
	}
	c.names = slices.Clip(c.names)
	return c
}

// Known reports whether a is an assignment (not the zero value).
func (a Assignment) Known() bool { return a.idx != nil }

// Len returns the number of shards a assigns.
func (a Assignment) Len() int { return len(a.idx) }

// Of returns the runner shard id is assigned to: "" when it is
// unassigned or beyond the assignment.
func (a Assignment) Of(id sharding.ShardID) string {
	if int(id) >= len(a.idx) {
		return ""
	}
	return a.names[a.idx[id]]
}

// Equal reports whether a and b assign every shard alike (both unknown,
// or both known and equal).
func (a Assignment) Equal(b Assignment) bool {
	// The names are in the order of their first shard: equal
	// assignments have equal tables.
	return a.Known() == b.Known() && slices.Equal(a.names, b.names) && slices.Equal(a.idx, b.idx)
}

// All yields each shard and the runner it is assigned to ("": none), in
// shard order.
func (a Assignment) All() iter.Seq2[sharding.ShardID, string] {
	return func(yield func(sharding.ShardID, string) bool) {
		for s, i := range a.idx {
			if !yield(sharding.ShardID(s), a.names[i]) {
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
	out := make(sharding.Assignment, len(a.idx))
	for s, i := range a.idx {
		out[s] = a.names[i]
	}
	return out
}
