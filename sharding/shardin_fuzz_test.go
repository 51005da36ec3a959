package sharding

import (
	"errors"
	"testing"
)

// FuzzParseShardIDIn: parsing a key of a cluster of n shards (what a runner
// does with every lock and handoff key it reads from etcd) never panics,
// accepts exactly the canonical form of a shard below n, with errors
// matching ErrInvalidShardID, and round-trips every such shard.
func FuzzParseShardIDIn(f *testing.F) {
	for _, s := range []string{"0", "7", "255", "256", "07", "+7", "-1", "4294967295", "4294967296", "", " 1", "abc"} {
		f.Add(s, 256, uint32(len(s)))
	}
	f.Add("0", 0, uint32(0))
	f.Add("0", -1, uint32(0))
	f.Add("16383", MaxShards, uint32(MaxShards-1))
	f.Fuzz(func(t *testing.T, s string, n int, v uint32) {
		id, err := ParseShardIDIn(s, n)
		want, werr := ParseShardID(s)
		switch {
		case err != nil && !errors.Is(err, ErrInvalidShardID):
			t.Fatalf("ParseShardIDIn(%q, %d) = %v, want ErrInvalidShardID", s, n, err)
		case werr == nil && n > 0 && uint64(want) < uint64(n):
			if err != nil || id != want {
				t.Fatalf("ParseShardIDIn(%q, %d) = %d, %v; want %d", s, n, id, err, want)
			}
		case err == nil:
			t.Fatalf("ParseShardIDIn(%q, %d) = %d, want an error", s, n, id)
		}
		if n > 0 && uint64(v) < uint64(n) {
			if got, err := ParseShardIDIn(ShardID(v).String(), n); err != nil || got != ShardID(v) {
				t.Fatalf("ParseShardIDIn(%q, %d) = %d, %v; want %d", ShardID(v).String(), n, got, err, v)
			}
		}
	})
}
