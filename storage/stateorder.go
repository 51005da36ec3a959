package storage

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/shardhost/shardhost/sharding"
)

// The order of one client's state writes to a shard (see ShardStates).
// Every state write also puts the shard's order key (StateOrderKey) and
// requires it at the revision the client last saw (StateOrder): a write
// whose outcome was unknown (ErrUnavailable: a timeout) and that the store
// applies later, after a newer write of the same client, is then refused
// instead of undoing it — a reminder cancelled, then registered again by
// the late write, or progress going backwards. A write refused because
// another of the client's writes moved the key (one that landed late, or a
// concurrent one) is made again at the key's current revision: it is the
// newer, or a concurrent, write. The key's value is empty; only its
// revision counts.

// KeyspaceStateOrder holds the order key of each shard with state:
//
//	stateorder/{shard}    its revision orders the shard's state writes
const KeyspaceStateOrder Keyspace = "stateorder"

// StateOrderKey is the order key of shard's state, relative to the
// namespace.
func StateOrderKey(shard sharding.ShardID) string {
	return string(KeyspaceStateOrder) + "/" + shard.String()
}

// MaxStateOrderRetries bounds how many times WriteOrdered makes a write
// again after finding its shard's order key moved.
const MaxStateOrderRetries = 8

// StateOrder is what one client knows of each shard's order key: the
// revision its last write left, or the one a refused write found (0: none
// known, taken as "no key", corrected by the store's refusal). Safe for
// concurrent use; the zero value is ready.
type StateOrder struct {
	mu  sync.Mutex
	rev map[sharding.ShardID]Revision
}

// Expect returns the revision shard's order key is believed to be at.
func (o *StateOrder) Expect(shard sharding.ShardID) Revision {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.rev[shard]
}

// Saw records that shard's order key is at rev.
func (o *StateOrder) Saw(shard sharding.ShardID, rev Revision) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.rev == nil {
		o.rev = make(map[sharding.ShardID]Revision)
	}
	o.rev[shard] = rev
}

// StateOrderError reports a state write refused because its shard's order
// key was at revision Current (0: absent), not at Expected: another write
// of the same client landed in between. WriteOrdered makes the write again;
// it reaches a caller only after MaxStateOrderRetries, as a failure whose
// write did not happen.
type StateOrderError struct {
	Shard             sharding.ShardID
	Expected, Current Revision
}

func (e *StateOrderError) Error() string {
	return fmt.Sprintf("storage: state of shard %d changed meanwhile (order revision %d, expected %d)", e.Shard, e.Current, e.Expected)
}

// WriteOrdered carries out writes through attempt, which tries writes[i]
// for each i of idx with its shard's order key expected at expect[k] and
// returns one result per index (a *StateOrderError for a write refused by
// the order key, a *FencedError for one refused by the lock) and the
// transaction error, if any. Writes refused by the order key are tried
// again at the revision found, at most MaxStateOrderRetries times; o
// learns every revision written or found. The results are in the order of
// writes; the first transaction error is returned.
func WriteOrdered(ctx context.Context, o *StateOrder, writes []ShardWrite,
	attempt func(ctx context.Context, idx []int, expect []Revision) ([]ShardWriteResult, error)) ([]ShardWriteResult, error) {
	out := make([]ShardWriteResult, len(writes))
	idx := make([]int, len(writes))
	for i := range idx {
		idx[i] = i
	}
	var first error
	for try := 0; len(idx) > 0; try++ {
		expect := make([]Revision, len(idx))
		for k, i := range idx {
			expect[k] = o.Expect(writes[i].Shard)
		}
		res, err := attempt(ctx, idx, expect)
		if err != nil && first == nil {
			first = err
		}
		again := idx[:0:0]
		for k, i := range idx {
			r := res[k]
			out[i] = r
			var oe *StateOrderError
			switch {
			case r.Err == nil:
				o.Saw(r.Shard, r.Revision)
			case errors.As(r.Err, &oe):
				o.Saw(r.Shard, oe.Current)
				if try < MaxStateOrderRetries && ctx.Err() == nil {
					again = append(again, i)
				}
			}
		}
		idx = again
	}
	return out, first
}
