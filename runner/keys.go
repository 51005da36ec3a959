package runner

import (
	"bytes"
	"strings"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Keys and values the runner did not write (or that a person damaged) are
// ignored and logged once per key at WARN, until the key is deleted or
// becomes valid again. At most maxBadKeys keys are remembered: beyond that
// new ones are ignored without a log line each.

// maxBadKeys bounds the memory spent remembering logged keys.
const maxBadKeys = 4096

// badKeyLocked logs, once per key, that key of keyspace ks is ignored.
func (r *Runner) badKeyLocked(ks storage.Keyspace, key, what string, err error) {
	k := storage.Key(ks, key)
	if _, logged := r.badKeys[k]; logged {
		return
	}
	if len(r.badKeys) >= maxBadKeys {
		if !r.badKeysFull {
			r.badKeysFull = true
			r.log.Warn("too many damaged keys; further ones are ignored without a log line each", "limit", maxBadKeys)
		}
		return
	}
	r.badKeys[k] = struct{}{}
	r.log.Warn(what, "key", k, "err", err)
}

// goodKeyLocked forgets a logged key that was deleted or became valid.
func (r *Runner) goodKeyLocked(ks storage.Keyspace, key string) {
	if len(r.badKeys) > 0 {
		delete(r.badKeys, storage.Key(ks, key))
	}
}

// shardOfKeyLocked parses the shard of a key of keyspace ks strictly
// (canonical decimal, below NumShards); other keys are logged once and
// ignored.
func (r *Runner) shardOfKeyLocked(ks storage.Keyspace, key string) (sharding.ShardID, bool) {
	id, err := sharding.ParseShardIDIn(key, r.cfg.NumShards)
	if err != nil {
		r.badKeyLocked(ks, key, "ignoring a key that names no shard of this cluster", err)
		return 0, false
	}
	return id, true
}

// decodeLockLocked decodes a lock. A key that names no shard is logged
// once and ignored (ok false). A corrupt value still names its lease and
// epoch, which is all ownership depends on: it is logged once and kept.
func (r *Runner) decodeLockLocked(kv storage.KeyValue) (storage.Lock, bool) {
	id, ok := r.shardOfKeyLocked(storage.KeyspaceShards, kv.Key)
	if !ok {
		return storage.Lock{}, false
	}
	if kv.Lease != r.lease && kv.Lease != storage.NoLease {
		// Another runner's lock: routing and every decision here follow its
		// lease and epoch; its value is its owner's to check (every runner
		// sees every lock, so decoding them all would cost the cluster
		// runners x shards decodes per reassignment).
		return storage.Lock{Shard: id, Lease: kv.Lease, Epoch: storage.Epoch(kv.ModRevision)}, true
	}
	if kv.Lease == r.lease && bytes.Equal(kv.Value, r.ownerValue) {
		// Our own lock as we write it (every acquisition shows up here).
		r.goodKeyLocked(storage.KeyspaceShards, kv.Key)
		return storage.Lock{Shard: id, Owner: r.owner(), Lease: kv.Lease, Epoch: storage.Epoch(kv.ModRevision)}, true
	}
	l, err := storage.DecodeLock(kv)
	if err != nil {
		r.badKeyLocked(storage.KeyspaceShards, kv.Key, "lock value corrupt; ownership still follows its lease", err)
	} else {
		r.goodKeyLocked(storage.KeyspaceShards, kv.Key)
	}
	return l, true
}

// forgetBadKeysLocked forgets the logged keys of keyspace ks (its listing
// is being replaced: keys deleted meanwhile sent no event).
func (r *Runner) forgetBadKeysLocked(ks storage.Keyspace) {
	prefix := string(ks) + "/"
	for k := range r.badKeys {
		if strings.HasPrefix(k, prefix) {
			delete(r.badKeys, k)
		}
	}
}
