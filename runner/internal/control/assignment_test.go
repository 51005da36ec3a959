package control

import (
	"slices"
	"strconv"
	"testing"

	"github.com/shardhost/shardhost/sharding"
)

func TestCompactAssignmentReadsAsTheAssignment(t *testing.T) {
	for _, a := range []sharding.Assignment{
		{"b", "a", "b", "", "c"},
		{"", "", ""},
		{},
	} {
		c := CompactAssignment(a)
		if !c.Known() || c.Len() != len(a) {
			t.Errorf("CompactAssignment(%q): Known %v, Len %d; want true, %d", a, c.Known(), c.Len(), len(a))
		}
		for s, want := range a {
			if got := c.Of(sharding.ShardID(s)); got != want {
				t.Errorf("CompactAssignment(%q).Of(%d) = %q, want %q", a, s, got, want)
			}
		}
		if got := c.Of(sharding.ShardID(len(a))); got != "" {
			t.Errorf("CompactAssignment(%q).Of(%d) (beyond) = %q, want \"\"", a, len(a), got)
		}
		if got := c.Expand(); !slices.Equal(got, a) || got == nil {
			t.Errorf("CompactAssignment(%q).Expand() = %q", a, got)
		}
		var all sharding.Assignment
		for _, id := range c.All() {
			all = append(all, id)
		}
		if !slices.Equal(all, a) {
			t.Errorf("CompactAssignment(%q).All() yields %q", a, all)
		}
	}
	if c := CompactAssignment(nil); c.Known() || c.Expand() != nil || c.Of(0) != "" {
		t.Errorf("CompactAssignment(nil) = %+v, want unknown", c)
	}
}

func TestCompactAssignmentsEqualExactlyWhenTheAssignmentsDo(t *testing.T) {
	as := []sharding.Assignment{nil, {}, {"a", "b"}, {"b", "a"}, {"a", "a"}, {"a", "b", "a"}, {"a", ""}}
	for _, x := range as {
		for _, y := range as {
			want := (x == nil) == (y == nil) && slices.Equal(x, y)
			if got := CompactAssignment(x).Equal(CompactAssignment(y)); got != want {
				t.Errorf("Equal(%q, %q) = %v, want %v", x, y, got, want)
			}
		}
	}
}

func TestCompactAssignmentOfMaxShardsDistinctRunners(t *testing.T) {
	a := make(sharding.Assignment, sharding.MaxShards)
	for s := range a {
		a[s] = strconv.Itoa(s) // every shard its own runner
	}
	c := CompactAssignment(a)
	for _, s := range []int{0, 1, sharding.MaxShards - 1} {
		if got := c.Of(sharding.ShardID(s)); got != a[s] {
			t.Errorf("Of(%d) = %q, want %q", s, got, a[s])
		}
	}
}
