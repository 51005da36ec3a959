package runner

import (
	"bytes"
	"log/slog"
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

// damagedKeys remembers the damaged keys already logged (guarded by
// Runner.mu).
type damagedKeys struct {
	log       *slog.Logger
	numShards int
	logged    map[string]struct{}
	full      bool // maxBadKeys reached, and said once
}

func newDamagedKeys(log *slog.Logger, numShards int) damagedKeys {
	return damagedKeys{log: log, numShards: numShards, logged: make(map[string]struct{})}
}

// bad logs, once per key, that key of keyspace ks is ignored.
func (d *damagedKeys) bad(ks storage.Keyspace, key, what string, err error) {
	k := storage.Key(ks, key)
	if _, logged := d.logged[k]; logged {
		return
	}
	if len(d.logged) >= maxBadKeys {
		if !d.full {
			d.full = true
			d.log.Warn("too many damaged keys; further ones are ignored without a log line each", "limit", maxBadKeys)
		}
		return
	}
	d.logged[k] = struct{}{}
	d.log.Warn(what, "key", k, "err", err)
}

// good forgets a logged key that was deleted or became valid.
func (d *damagedKeys) good(ks storage.Keyspace, key string) {
	if len(d.logged) > 0 {
		delete(d.logged, storage.Key(ks, key))
	}
}

// forget forgets the logged keys of keyspace ks (its listing is being
// replaced: keys deleted meanwhile sent no event).
func (d *damagedKeys) forget(ks storage.Keyspace) {
	prefix := string(ks) + "/"
	for k := range d.logged {
		if strings.HasPrefix(k, prefix) {
			delete(d.logged, k)
		}
	}
}

// shardOf parses the shard of a key of keyspace ks strictly (canonical
// decimal, below NumShards); other keys are logged once and ignored.
func (d *damagedKeys) shardOf(ks storage.Keyspace, key string) (sharding.ShardID, bool) {
	id, err := sharding.ParseShardIDIn(key, d.numShards)
	if err != nil {
		d.bad(ks, key, "ignoring a key that names no shard of this cluster", err)
		return 0, false
	}
	return id, true
}

// decodeLockLocked decodes a lock. A key that names no shard is logged
// once and ignored (ok false). A corrupt value still names its lease and
// epoch, which is all ownership depends on: it is logged once and kept.
func (r *Runner) decodeLockLocked(kv storage.KeyValue) (storage.Lock, bool) {
	id, ok := r.keys.shardOf(storage.KeyspaceShards, kv.Key)
	if !ok {
		return storage.Lock{}, false
	}
	if kv.Lease != r.att.lease && kv.Lease != storage.NoLease {
		// Another runner's lock: routing and every decision here follow its
		// lease and epoch; its value is its owner's to check (every runner
		// sees every lock, so decoding them all would cost the cluster
		// runners x shards decodes per reassignment).
		return storage.Lock{Shard: id, Lease: kv.Lease, Epoch: storage.Epoch(kv.ModRevision)}, true
	}
	if kv.Lease == r.att.lease && bytes.Equal(kv.Value, r.ownerValue) {
		// Our own lock as we write it (every acquisition shows up here).
		r.keys.good(storage.KeyspaceShards, kv.Key)
		return storage.Lock{Shard: id, Owner: r.owner(), Lease: kv.Lease, Epoch: storage.Epoch(kv.ModRevision)}, true
	}
	l, err := storage.DecodeLock(kv)
	if err != nil {
		r.keys.bad(storage.KeyspaceShards, kv.Key, "lock value corrupt; ownership still follows its lease", err)
	} else {
		r.keys.good(storage.KeyspaceShards, kv.Key)
	}
	return l, true
}
