package sharding

import (
	"errors"
	"fmt"
	"strconv"
)

// ShardID identifies a shard: an integer in [0, N) for a cluster of N shards.
type ShardID uint32

// String returns the decimal form of s, as used in storage keys.
func (s ShardID) String() string { return strconv.FormatUint(uint64(s), 10) }

// ErrInvalidShardID reports a string that is not the canonical form of a
// shard ID (see [ParseShardID]).
var ErrInvalidShardID = errors.New("sharding: invalid shard id")

// ParseShardID parses the canonical decimal form produced by
// [ShardID.String] and nothing else: ASCII digits only, no sign, no leading
// zero (except "0" itself), no spaces, at most 2^32-1. Keys such as "07",
// "+7" or " 7" are rejected, so that one shard has exactly one key. Errors
// match [ErrInvalidShardID].
func ParseShardID(s string) (ShardID, error) {
	if s == "" || len(s) > 10 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("%w: %q", ErrInvalidShardID, s)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%w: %q", ErrInvalidShardID, s)
		}
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%w: %q: out of range", ErrInvalidShardID, s)
	}
	return ShardID(v), nil
}

// ParseShardIDIn parses s like [ParseShardID] and also requires the shard
// to exist in a cluster of n shards (s < n).
func ParseShardIDIn(s string, n int) (ShardID, error) {
	id, err := ParseShardID(s)
	if err != nil {
		return 0, err
	}
	if uint64(id) >= uint64(max(n, 0)) {
		return 0, fmt.Errorf("%w: %q: not below the shard count %d", ErrInvalidShardID, s, n)
	}
	return id, nil
}

// MaxShards is the largest supported shard count per cluster. One runner
// with the default settings owns all 65 536 shards of a fresh namespace on
// a single etcd member in about 2 s (BenchmarkSingleRunnerOwnsAll; 131 072
// in 3-4.5 s), and 20 runners meet the 6 s cold-start target at 65 536, so
// taking the shards is not what bounds it. What grows with the count is
// etcd's steady load (each runner re-reads its locks every VerifyInterval,
// LeaseTTL/3 by default, one transaction per storage.MaxShardsPerTxn shards)
// and the work every watcher does per lock event; the figures and commands
// are in BENCHMARKS.md ("Acquisition and assignment").
const MaxShards = 1 << 16

// ErrInvalidNumShards reports a shard count outside [1, MaxShards].
var ErrInvalidNumShards = errors.New("sharding: invalid number of shards")

// ValidateNumShards reports whether n is a usable shard count: 1 <= n <= MaxShards.
func ValidateNumShards(n int) error {
	if n < 1 || n > MaxShards {
		return fmt.Errorf("%w: %d (want 1..%d)", ErrInvalidNumShards, n, MaxShards)
	}
	return nil
}

// ShardOf returns the shard of entityID in a cluster of n shards:
// FNV-1a-64 of the ID's bytes, modulo n. n must be valid (see
// [ValidateNumShards]); ShardOf panics on n <= 0.
func ShardOf(entityID string, n int) ShardID {
	if n <= 0 {
		panic("sharding: ShardOf with n <= 0")
	}
	return ShardID(Hash64(entityID) % uint64(n))
}

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// Hash64 is FNV-1a-64 of the bytes of s (identical to hash/fnv's New64a,
// without allocating).
func Hash64(s string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}
