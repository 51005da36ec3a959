package sharding

import (
	"maps"
	"slices"
	"testing"
)

func TestDiff(t *testing.T) {
	tests := []struct {
		from, to Assignment
		want     []ShardID
	}{
		{nil, nil, nil},
		{Assignment{"a", "b"}, Assignment{"a", "b"}, nil},
		{Assignment{"a", "b", "c"}, Assignment{"a", "c", "b"}, []ShardID{1, 2}},
		{Assignment{"a", "", "c"}, Assignment{"", "", "c"}, []ShardID{0}},
		{Assignment{"a", "b"}, Assignment{"a", "b", "c"}, []ShardID{2}},
		{Assignment{"a", "b", ""}, Assignment{"a"}, []ShardID{1}},
	}
	for _, tt := range tests {
		if got := Diff(tt.from, tt.to); !slices.Equal(got, tt.want) {
			t.Errorf("Diff(%q, %q) = %v, want %v", tt.from, tt.to, got, tt.want)
		}
	}
}

func TestShardsOfAndCounts(t *testing.T) {
	a := Assignment{"b", "a", "", "b", "c", "b", ""}
	shards := map[string][]ShardID{
		"a": {1},
		"b": {0, 3, 5},
		"c": {4},
		"":  {2, 6},
		"d": nil,
	}
	for id, want := range shards {
		if got := a.ShardsOf(id); !slices.Equal(got, want) {
			t.Errorf("%q.ShardsOf(%q) = %v, want %v", a, id, got, want)
		}
	}
	want := map[string]int{"a": 1, "b": 3, "c": 1}
	if got := a.Counts(); !maps.Equal(got, want) {
		t.Errorf("%q.Counts() = %v, want %v", a, got, want)
	}
	if got := Assignment(nil).Counts(); len(got) != 0 {
		t.Errorf("Assignment(nil).Counts() = %v, want empty", got)
	}
}

func TestAssignmentDigest(t *testing.T) {
	a := Assignment{"r1", "r2", "r1"}
	if a.Digest() != (Assignment{"r1", "r2", "r1"}).Digest() {
		t.Error("equal assignments have different digests")
	}
	for _, b := range []Assignment{{"r1", "r1", "r2"}, {"r1", "r2"}, {"r1r2", "", "r1"}, nil} {
		if a.Digest() == b.Digest() {
			t.Errorf("Digest(%q) == Digest(%q)", a, b)
		}
	}
}
