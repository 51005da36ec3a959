package control

import (
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// LockView is a runner's view of every shard's lock (the lock watch),
// indexed by shard: every runner holds the whole table, and the control
// loop and routing read it on every decision, so it is a slice, not a map.
// A shard without a lock has Epoch 0 (epochs are revisions, > 0).
type LockView []storage.Lock

// NewLockView returns a view of n shards, none of them locked.
func NewLockView(n int) LockView { return make(LockView, n) }

// Get returns shard id's lock; held is false when it has none (l is then
// the zero Lock).
func (v LockView) Get(id sharding.ShardID) (l storage.Lock, held bool) {
	l = v[id]
	return l, l.Epoch != 0
}

// Set records l as its shard's lock.
func (v LockView) Set(l storage.Lock) { v[l.Shard] = l }

// Del records that shard id has no lock.
func (v LockView) Del(id sharding.ShardID) { v[id] = storage.Lock{} }

// Reset forgets every lock.
func (v LockView) Reset() { clear(v) }

// SettledElsewhere reports whether every shard is locked by a live runner
// (a lease in live) other than the one holding lease self: a runner that
// owns nothing and sees this joins a settled cluster, with nothing to take
// directly and no cold start under way. O(shards); false for an empty view.
func (v LockView) SettledElsewhere(self storage.LeaseID, live map[storage.LeaseID]storage.Runner) bool {
	if len(v) == 0 {
		return false
	}
	for _, l := range v {
		if l.Epoch == 0 || l.Lease == self {
			return false
		}
		if _, ok := live[l.Lease]; !ok {
			return false
		}
	}
	return true
}

// EpochOf returns the epoch at which held lists shard id, 0 when it does
// not list it.
func EpochOf(held []storage.Held, id sharding.ShardID) storage.Epoch {
	for _, h := range held {
		if h.Shard == id {
			return h.Epoch
		}
	}
	return 0
}
