package storage

import (
	"errors"
	"fmt"
	"slices"

	"github.com/shardhost/shardhost/sharding"
)

// Argument checks shared by the Store implementations, so that each
// refuses the same bad input with the same ErrInvalidArgument before any
// call is made, and how they split a call into batches.

// CheckShards reports an ErrInvalidArgument if shards has duplicates.
func CheckShards(shards []sharding.ShardID) error {
	if len(shards) < 2 {
		return nil
	}
	s := slices.Clone(shards)
	slices.Sort(s)
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			return fmt.Errorf("%w: shard %d listed twice", ErrInvalidArgument, s[i])
		}
	}
	return nil
}

// CheckHeld reports an ErrInvalidArgument if held names a shard twice or
// an epoch that is not positive.
func CheckHeld(held []Held) error {
	ids := make([]sharding.ShardID, len(held))
	for i, h := range held {
		if err := CheckEpoch(h.Shard, h.Epoch); err != nil {
			return err
		}
		if h.Tell != "" {
			if err := ValidateRunnerID(h.Tell); err != nil {
				return fmt.Errorf("shard %d: runner to tell: %w", h.Shard, err)
			}
		}
		ids[i] = h.Shard
	}
	return CheckShards(ids)
}

// CheckHandoffRefs checks the arguments of DeleteHandoffs: a lease, valid
// old owners and distinct shards.
func CheckHandoffRefs(lease LeaseID, refs []HandoffRef) error {
	ids := make([]sharding.ShardID, len(refs))
	for i, r := range refs {
		if err := ValidateRunnerID(r.From); err != nil {
			return fmt.Errorf("handoff record of shard %d: %w", r.Shard, err)
		}
		ids[i] = r.Shard
	}
	return errors.Join(CheckLease(lease), CheckShards(ids))
}

// CheckLease reports an ErrInvalidArgument for NoLease: locks are taken,
// checked, moved and released on behalf of a lease. (etcd compares the
// lease of a missing key as 0, so NoLease would match absent locks.)
func CheckLease(lease LeaseID) error {
	if lease == NoLease {
		return fmt.Errorf("%w: no lease", ErrInvalidArgument)
	}
	return nil
}

// CheckEpoch reports an ErrInvalidArgument for an epoch that is not
// positive. (Epochs are revisions; etcd compares the revision of a missing
// key as 0, so epoch 0 would match an absent lock.)
func CheckEpoch(shard sharding.ShardID, epoch Epoch) error {
	if epoch <= 0 {
		return fmt.Errorf("%w: shard %d: epoch %d, want > 0", ErrInvalidArgument, shard, epoch)
	}
	return nil
}

// CheckCheckpointWrite checks the arguments of a checkpoint write or
// delete: an epoch (see CheckEpoch) and a prev revision that is 0 or more,
// or AnyRevision.
func CheckCheckpointWrite(shard sharding.ShardID, epoch Epoch, prev Revision) error {
	if prev < AnyRevision {
		return errors.Join(CheckEpoch(shard, epoch), fmt.Errorf("%w: shard %d: checkpoint revision %d, want >= 0 or AnyRevision", ErrInvalidArgument, shard, prev))
	}
	return CheckEpoch(shard, epoch)
}

// CheckHeldBy checks the arguments of Verify and Release: a lease and
// held locks (see CheckLease and CheckHeld).
func CheckHeldBy(lease LeaseID, held []Held) error {
	return errors.Join(CheckLease(lease), CheckHeld(held))
}

// CheckShardsFor checks the arguments of Acquire and Rewrite: a lease and
// distinct shards (see CheckLease and CheckShards).
func CheckShardsFor(lease LeaseID, shards []sharding.ShardID) error {
	return errors.Join(CheckLease(lease), CheckShards(shards))
}

// CheckTransfer reports an ErrInvalidArgument for a transfer without a
// valid old owner, without both leases or with an epoch that is not
// positive.
func CheckTransfer(req TransferRequest) error {
	var from error
	if err := ValidateRunnerID(req.From); err != nil {
		from = fmt.Errorf("transfer of shard %d: from: %w", req.Shard, err)
	}
	return errors.Join(from, CheckLease(req.FromLease), CheckLease(req.ToLease), CheckEpoch(req.Shard, req.FromEpoch))
}

// CheckTransfers checks the arguments of Transfer: every request (see
// CheckTransfer), on distinct shards.
func CheckTransfers(reqs []TransferRequest) error {
	ids := make([]sharding.ShardID, len(reqs))
	for i, req := range reqs {
		if err := CheckTransfer(req); err != nil {
			return err
		}
		ids[i] = req.Shard
	}
	return CheckShards(ids)
}

// EncodeHandoffs checks the arguments of PutHandoffs (a lease, valid
// records on distinct shards) and returns the encoded records.
func EncodeHandoffs(lease LeaseID, puts []HandoffPut) ([][]byte, error) {
	ids := make([]sharding.ShardID, len(puts))
	vals := make([][]byte, len(puts))
	for i, p := range puts {
		v, err := EncodeHandoff(p.Record)
		if err != nil {
			return nil, err
		}
		ids[i], vals[i] = p.Shard, v
	}
	if err := CheckShardsFor(lease, ids); err != nil {
		return nil, err
	}
	return vals, nil
}

// Batches splits n items into consecutive [start, end) ranges of at most size.
func Batches(n, size int) [][2]int {
	var out [][2]int
	for start := 0; start < n; start += size {
		out = append(out, [2]int{start, min(start+size, n)})
	}
	return out
}
