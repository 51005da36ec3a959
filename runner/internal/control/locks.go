package control

import (
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// LockView is what a runner knows of the shards' locks, by shard: every
// lock with a full view (the lock watch), only those of the shards that
// concern it otherwise (its store calls' results and its notices). A shard
// it has no lock for is absent (or unknown).
type LockView struct {
	m map[sharding.ShardID]storage.Lock
	n int // shards in the cluster
}

// NewLockView returns a view of n shards, none of them locked.
func NewLockView(n int) LockView { return LockView{m: make(map[sharding.ShardID]storage.Lock), n: n} }

// Get returns shard id's lock; held is false when it has none (l is then
// the zero Lock).
func (v LockView) Get(id sharding.ShardID) (l storage.Lock, held bool) {
	l, held = v.m[id]
	return l, held
}

// Set records l as its shard's lock.
func (v LockView) Set(l storage.Lock) { v.m[l.Shard] = l }

// Del records that shard id has no lock (or that it is not known).
func (v LockView) Del(id sharding.ShardID) { delete(v.m, id) }

// Reset forgets every lock.
func (v LockView) Reset() { clear(v.m) }

// Len returns how many locks the view holds.
func (v LockView) Len() int { return len(v.m) }

// All yields the locks of the view, in no order.
func (v LockView) All() map[sharding.ShardID]storage.Lock { return v.m }

// SettledElsewhere reports whether every shard is locked by a live runner
// (a lease in live) other than the one holding lease self: a runner that
// owns nothing and sees this joins a settled cluster, with nothing to take
// directly and no cold start under way. O(shards); false for an empty view.
func (v LockView) SettledElsewhere(self storage.LeaseID, live map[storage.LeaseID]storage.Runner) bool {
	if len(v.m) == 0 || len(v.m) < v.n {
		return false
	}
	for _, l := range v.m {
		if l.Lease == self {
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
