package sharding

import (
	"errors"
	"hash/fnv"
	"testing"
)

// TestShardOfVectors pins the entity-to-shard mapping, which is part of the
// wire contract: changing it moves every entity of a live cluster.
func TestShardOfVectors(t *testing.T) {
	tests := []struct {
		id   string
		n    int
		hash uint64
		want ShardID
	}{
		{"counter-42", 1024, 0x73c2492824bba838, 56},
		{"counter-42", 1000, 0x73c2492824bba838, 464},
		{"counter-42", 1, 0x73c2492824bba838, 0},
		{"", 16, 0xcbf29ce484222325, 5}, // the FNV-1a-64 offset basis
		{"a", 16384, 0xaf63dc4c8601ec8c, 11404},
		{"order:9f3c2e", 4096, 0x2849b833935ee48f, 1167},
		{"user/Zoë-東京-🚀", 1 << 20, 0xc1859681ef909571, 38257},
	}
	for _, tt := range tests {
		if got := Hash64(tt.id); got != tt.hash {
			t.Errorf("Hash64(%q) = %#x, want %#x", tt.id, got, tt.hash)
		}
		h := fnv.New64a()
		h.Write([]byte(tt.id))
		if got := h.Sum64(); got != tt.hash {
			t.Errorf("fnv.New64a(%q) = %#x, want %#x", tt.id, got, tt.hash)
		}
		if got := ShardOf(tt.id, tt.n); got != tt.want {
			t.Errorf("ShardOf(%q, %d) = %d, want %d", tt.id, tt.n, got, tt.want)
		}
	}
}

func TestShardIDRoundTrip(t *testing.T) {
	for _, s := range []ShardID{0, 1, 1023, MaxShards - 1, 1<<32 - 1} {
		got, err := ParseShardID(s.String())
		if err != nil || got != s {
			t.Errorf("ParseShardID(%q) = %d, %v, want %d, nil", s.String(), got, err, s)
		}
	}
	for _, in := range []string{"", "-1", "x", "4294967296"} {
		if _, err := ParseShardID(in); err == nil {
			t.Errorf("ParseShardID(%q) = nil error, want one", in)
		}
	}
}

// TestParseShardIDRejectsNonCanonical: a shard has exactly one key, so
// "07", "+7" or " 7" never name shard 7 (a stray key must not be taken for
// somebody's lock).
func TestParseShardIDRejectsNonCanonical(t *testing.T) {
	for _, in := range []string{"07", "00", "+7", "-0", " 7", "7 ", "7\n", "0x7", "1_0", "1e3", "٣", "７", "99999999999", "18446744073709551617"} {
		if got, err := ParseShardID(in); err == nil || !errors.Is(err, ErrInvalidShardID) {
			t.Errorf("ParseShardID(%q) = %d, %v; want ErrInvalidShardID", in, got, err)
		}
	}
	for _, tt := range []struct {
		in string
		n  int
		ok bool
	}{{"0", 1, true}, {"1", 1, false}, {"1023", 1024, true}, {"1024", 1024, false}, {"5", 0, false}, {"5", -1, false}, {"07", 1024, false}} {
		got, err := ParseShardIDIn(tt.in, tt.n)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidShardID)) {
			t.Errorf("ParseShardIDIn(%q, %d) = %d, %v; want ok=%v", tt.in, tt.n, got, err, tt.ok)
		}
	}
}

// FuzzParseShardID: parsing never panics, accepts exactly the canonical
// form (what ShardID.String produces) and round-trips every shard ID.
func FuzzParseShardID(f *testing.F) {
	for _, s := range []string{"0", "7", "07", "+7", "-1", "4294967295", "4294967296", "", " 1", "abc"} {
		f.Add(s, uint32(len(s)))
	}
	f.Fuzz(func(t *testing.T, s string, v uint32) {
		if id, err := ParseShardID(s); err == nil && id.String() != s {
			t.Fatalf("ParseShardID(%q) = %d, whose canonical form is %q", s, id, id.String())
		}
		id := ShardID(v)
		if got, err := ParseShardID(id.String()); err != nil || got != id {
			t.Fatalf("ParseShardID(%q) = %d, %v; want %d", id.String(), got, err, id)
		}
	})
}

func TestValidateNumShards(t *testing.T) {
	for _, tt := range []struct {
		n  int
		ok bool
	}{{-1, false}, {0, false}, {1, true}, {MaxShards, true}, {MaxShards + 1, false}} {
		err := ValidateNumShards(tt.n)
		if (err == nil) != tt.ok || (err != nil && !errors.Is(err, ErrInvalidNumShards)) {
			t.Errorf("ValidateNumShards(%d) = %v, want ok=%v", tt.n, err, tt.ok)
		}
	}
}
