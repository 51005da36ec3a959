package sharding

import (
	"fmt"
	"strconv"
)

// JumpHash returns the jump consistent hash strategy (Lamping and Veach,
// "A Fast, Minimal Memory, Consistent Hash Algorithm", 2014) over runners
// numbered by the decimal ordinal their ID ends in ("runner-0", "runner-1",
// ...): shard s goes to the runner whose ordinal is JumpHash(hash(s), M).
//
// The M runners with weight > 0 must carry exactly the ordinals 0..M-1 (the
// prefixes may differ), else Assign fails with an [*OrdinalError]. Runners of
// weight 0 are ignored and need no ordinal; any positive weight counts as 1,
// so weights do not skew the shares. It suits fleets numbered like a
// Kubernetes StatefulSet that grow and shrink at the highest ordinal: adding
// runner M moves about N/(M+1) shards, all to it, and removing runner M-1
// moves only its shards. Removing or draining any other ordinal is an error.
// Loads vary binomially like [Rendezvous]. Input.Current is ignored.
func JumpHash() Strategy { return jumpHash{} }

type jumpHash struct{}

func (jumpHash) Name() string { return nameJumpHash }

// MembershipOnly implements [MembershipOnly]: Input.Current is ignored.
func (jumpHash) MembershipOnly() bool { return true }

func (s jumpHash) Assign(in Input) (Assignment, error) {
	ms, err := members(in)
	if err != nil {
		return nil, assignError(s, in, err)
	}
	out := unassigned(in.NumShards)
	if len(ms) == 0 {
		return out, nil
	}
	byOrdinal := make([]string, len(ms))
	for _, m := range ms {
		ord := ordinal(m.id)
		switch {
		case ord < 0 || ord >= len(ms):
			return nil, assignError(s, in, &OrdinalError{RunnerID: m.id, Ordinal: ord, NumRunners: len(ms)})
		case byOrdinal[ord] != "":
			return nil, assignError(s, in, &OrdinalError{RunnerID: m.id, Ordinal: ord, NumRunners: len(ms), Other: byOrdinal[ord]})
		}
		byOrdinal[ord] = m.id
	}
	// len(ms) distinct ordinals in [0, len(ms)): every bucket has a runner.
	for sh := range out {
		out[sh] = byOrdinal[jump(shardKey(sh), len(ms))]
	}
	return out, nil
}

// OrdinalError reports a runner set that [JumpHash] cannot number 0..M-1.
// It matches [ErrBadOrdinal] with [errors.Is].
type OrdinalError struct {
	// RunnerID is the runner at fault.
	RunnerID string
	// Ordinal is the ordinal RunnerID ends in, or -1 if it ends in no
	// decimal number that fits an int.
	Ordinal int
	// NumRunners is M, the number of runners with weight > 0.
	NumRunners int
	// Other is, for a duplicate ordinal, the other runner that has it.
	Other string
}

func (e *OrdinalError) Error() string {
	switch {
	case e.Other != "":
		return fmt.Sprintf("%v: runners %q and %q both have ordinal %d", ErrBadOrdinal, e.Other, e.RunnerID, e.Ordinal)
	case e.Ordinal < 0:
		return fmt.Sprintf("%v: runner %q: ID does not end in a decimal ordinal", ErrBadOrdinal, e.RunnerID)
	}
	return fmt.Sprintf("%v: runner %q: ordinal %d out of range 0..%d", ErrBadOrdinal, e.RunnerID, e.Ordinal, e.NumRunners-1)
}

// Unwrap returns [ErrBadOrdinal].
func (e *OrdinalError) Unwrap() error { return ErrBadOrdinal }

// ordinal returns the decimal number id ends in, or -1 if there is none or it
// does not fit an int.
func ordinal(id string) int {
	i := len(id)
	for i > 0 && id[i-1] >= '0' && id[i-1] <= '9' {
		i--
	}
	if i == len(id) {
		return -1
	}
	v, err := strconv.Atoi(id[i:])
	if err != nil {
		return -1
	}
	return v
}

// jump is the jump consistent hash of key over buckets buckets, exactly as
// the reference code of the paper (including its float64 arithmetic, which
// has no sum to fuse and so rounds the same on every platform).
func jump(key uint64, buckets int) int {
	b, j := int64(-1), int64(0)
	for j < int64(buckets) {
		b = j
		key = key*2862933555777941757 + 1
		j = int64(float64(b+1) * (float64(int64(1)<<31) / float64((key>>33)+1)))
	}
	return int(b)
}
