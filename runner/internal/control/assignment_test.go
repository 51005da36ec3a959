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

// TestCompactAssignmentCountsAndNarrowsUpTo256Runners: an assignment of up
// to 256 distinct runners takes a byte a shard, one of more two bytes;
// both read alike, and Count counts a runner's shards.
func TestCompactAssignmentCountsAndNarrowsUpTo256Runners(t *testing.T) {
	for _, runners := range []int{1, 255, 256, 257, 600} {
		a := make(sharding.Assignment, 3*runners+5)
		for s := range a {
			a[s] = "r" + strconv.Itoa(s%runners)
		}
		c := CompactAssignment(a)
		if narrow := c.narrow != nil; narrow != (runners <= 256) {
			t.Errorf("%d runners: narrow %v", runners, narrow)
		}
		if got := c.Expand(); !slices.Equal(got, a) {
			t.Errorf("%d runners: Expand differs", runners)
		}
		for _, id := range []string{"r0", "r" + strconv.Itoa(runners-1)} {
			want := 0
			for _, x := range a {
				if x == id {
					want++
				}
			}
			if got := c.Count(id); got != want {
				t.Errorf("%d runners: Count(%s) = %d, want %d", runners, id, got, want)
			}
		}
		if got := c.Count("nobody"); got != 0 {
			t.Errorf("%d runners: Count(nobody) = %d", runners, got)
		}
	}
}
