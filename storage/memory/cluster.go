package memory

import (
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// maxHistory bounds the retained watch history; older events are compacted
// (watches that fall that far behind get storage.ErrCompacted, as on etcd).
const maxHistory = 1 << 16

// Cluster is the shared state of an in-process store: keys, leases,
// revisions and watch history. It is safe for concurrent use.
type Cluster struct {
	mu        sync.Mutex
	rev       storage.Revision
	kvs       map[string]*kv // by full key, e.g. "shards/12"
	leases    map[storage.LeaseID]*lease
	nextLease storage.LeaseID
	history   []event // ascending revision
	compacted storage.Revision
	changed   chan struct{} // closed and replaced on every write
	closed    bool
	unfenced  bool // DisableFencing: checkpoints ignore their epoch
}

type kv struct {
	value  []byte
	lease  storage.LeaseID
	create storage.Revision
	mod    storage.Revision
}

type lease struct {
	id     storage.LeaseID
	ttl    time.Duration
	expiry time.Time
	timer  *time.Timer
	keys   map[string]struct{}
}

type event struct {
	typ storage.EventType
	key string // full key
	kv  storage.KeyValue
}

// NewCluster returns an empty cluster at revision 1.
func NewCluster() *Cluster {
	return &Cluster{
		rev:       1,
		kvs:       make(map[string]*kv),
		leases:    make(map[storage.LeaseID]*lease),
		nextLease: 0x1000,
		changed:   make(chan struct{}),
	}
}

// NewStore returns a new client of c. name appears in errors only.
func (c *Cluster) NewStore(name string) *Store {
	return &Store{c: c, name: name, opTimeout: DefaultOpTimeout}
}

// New returns a client of a new, private cluster.
func New() *Store { return NewCluster().NewStore("memory") }

// Close stops every lease timer and ends every watch. Calls made afterwards
// fail with storage.ErrClosed.
func (c *Cluster) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	c.closed = true
	for _, l := range c.leases {
		l.timer.Stop()
	}
	close(c.changed)
}

// Revision returns the current revision.
func (c *Cluster) Revision() storage.Revision {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rev
}

// ExpireLease makes lease id expire now, as if its TTL had run out: the
// lease and its keys are deleted in one revision. It reports whether the
// lease existed.
func (c *Cluster) ExpireLease(id storage.LeaseID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.leases[id]
	if !ok {
		return false
	}
	c.revokeLocked(l)
	return true
}

// Compact discards the watch history before rev; watches from an earlier
// revision fail with storage.ErrCompacted.
func (c *Cluster) Compact(rev storage.Revision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.compactLocked(min(rev, c.rev))
}

func (c *Cluster) compactLocked(rev storage.Revision) {
	if rev <= c.compacted {
		return
	}
	c.compacted = rev
	i, _ := slices.BinarySearchFunc(c.history, rev, func(e event, r storage.Revision) int {
		return int(e.kv.ModRevision - r)
	})
	c.history = slices.Delete(c.history, 0, i)
}

// History returns the retained history of changes (every write and delete
// since the last compaction, in revision order) and whether it is complete
// (nothing was compacted, by Compact or by the bound on the history): what a
// test reads back to check what the store accepted.
func (c *Cluster) History() ([]storage.Event, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]storage.Event, len(c.history))
	for i, e := range c.history {
		out[i] = storage.Event{Type: e.typ, KV: e.kv}
		out[i].KV.Key = e.key
	}
	return out, c.compacted == 0
}

// Put writes key (a full key such as "shards/3") with value and lease,
// bypassing every check: a test hook to simulate other writers and corrupt
// values. It returns the revision of the write or ErrLeaseNotFound.
func (c *Cluster) Put(key string, value []byte, leaseID storage.LeaseID) (storage.Revision, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	tx := c.begin()
	if err := tx.put(key, value, leaseID); err != nil {
		return 0, err
	}
	return tx.commit(), nil
}

// Delete deletes key (a full key) bypassing every check: a test hook. It
// reports whether the key existed.
func (c *Cluster) Delete(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	tx := c.begin()
	ok := tx.del(key)
	tx.commit()
	return ok
}

// Get returns the stored form of key (a full key): a test hook.
func (c *Cluster) Get(key string) (storage.KeyValue, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.kvs[key]
	if !ok {
		return storage.KeyValue{}, false
	}
	return e.keyValue(key), true
}

// LeaseTTL returns the remaining time to live of a lease, or false if the
// lease does not exist.
func (c *Cluster) LeaseTTL(id storage.LeaseID) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.leases[id]
	if !ok {
		return 0, false
	}
	return time.Until(l.expiry), true
}

func (e *kv) keyValue(fullKey string) storage.KeyValue {
	_, name, _ := strings.Cut(fullKey, "/")
	return storage.KeyValue{
		Key:            name,
		Value:          slices.Clone(e.value),
		Lease:          e.lease,
		CreateRevision: e.create,
		ModRevision:    e.mod,
	}
}

// txn collects the writes of one revision. Callers hold c.mu.
type txn struct {
	c      *Cluster
	rev    storage.Revision
	events []event
}

func (c *Cluster) begin() *txn { return &txn{c: c, rev: c.rev + 1} }

func (tx *txn) put(key string, value []byte, leaseID storage.LeaseID) error {
	c := tx.c
	var l *lease
	if leaseID != storage.NoLease {
		var ok bool
		if l, ok = c.leases[leaseID]; !ok {
			return storage.ErrLeaseNotFound
		}
	}
	e, ok := c.kvs[key]
	if !ok {
		e = &kv{create: tx.rev}
		c.kvs[key] = e
	} else if old, ok := c.leases[e.lease]; ok && e.lease != leaseID {
		delete(old.keys, key)
	}
	e.value = slices.Clone(value)
	e.lease = leaseID
	e.mod = tx.rev
	if l != nil {
		l.keys[key] = struct{}{}
	}
	tx.events = append(tx.events, event{typ: storage.EventPut, key: key, kv: e.keyValue(key)})
	return nil
}

func (tx *txn) del(key string) bool {
	c := tx.c
	e, ok := c.kvs[key]
	if !ok {
		return false
	}
	if l, ok := c.leases[e.lease]; ok {
		delete(l.keys, key)
	}
	delete(c.kvs, key)
	_, name, _ := strings.Cut(key, "/")
	tx.events = append(tx.events, event{typ: storage.EventDelete, key: key, kv: storage.KeyValue{Key: name, ModRevision: tx.rev}})
	return true
}

// commit makes the writes visible at a new revision, if there were any, and
// returns the revision of the store afterwards.
func (tx *txn) commit() storage.Revision {
	c := tx.c
	if len(tx.events) == 0 {
		return c.rev
	}
	c.rev = tx.rev
	c.history = append(c.history, tx.events...)
	if len(c.history) > maxHistory {
		c.compactLocked(c.history[len(c.history)-maxHistory/2].kv.ModRevision)
	}
	if !c.closed {
		close(c.changed)
		c.changed = make(chan struct{})
	}
	return c.rev
}

func (c *Cluster) revokeLocked(l *lease) {
	l.timer.Stop()
	delete(c.leases, l.id)
	keys := make([]string, 0, len(l.keys))
	for k := range l.keys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	tx := c.begin()
	for _, k := range keys {
		tx.del(k)
	}
	tx.commit()
}

// expire is the lease timer's callback.
func (c *Cluster) expire(id storage.LeaseID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.leases[id]
	if !ok || c.closed {
		return
	}
	if d := time.Until(l.expiry); d > 0 { // renewed while the timer fired
		l.timer.Reset(d)
		return
	}
	c.revokeLocked(l)
}
