package storage

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/shardhost/shardhost/sharding"
)

// LeaseID identifies a lease in the store. The zero value means "no lease".
type LeaseID int64

// NoLease is the zero LeaseID: a key without a lease, or no lease granted yet.
const NoLease LeaseID = 0

// Revision is a store-wide, strictly increasing modification counter.
type Revision int64

// Epoch identifies one ownership of a shard: the revision at which the lock
// was last written by its holder. Epochs of a shard strictly increase across
// its owners; writes fenced by an epoch succeed only while it is current.
type Epoch int64

// MaxTxnOps is the largest number of operations an implementation puts in
// one transaction (etcd's default --max-txn-ops).
const MaxTxnOps = 128

// MaxShardsPerTxn is how many shards one batched transaction covers. Each
// shard needs a nested per-shard transaction (acquire, release, rewrite) or
// two comparisons (verify); etcd counts the operations of a nested
// transaction against the budget left by its parent, so half of MaxTxnOps
// keeps every batch within the limit.
const MaxShardsPerTxn = MaxTxnOps / 2

// Lease is a granted lease: keys attached to it are deleted when it expires
// or is revoked.
type Lease struct {
	ID  LeaseID
	TTL time.Duration // granted time to live; may be longer than requested
}

// Leases grants, renews and revokes leases.
type Leases interface {
	// Grant creates a lease of at least ttl.
	Grant(ctx context.Context, ttl time.Duration) (Lease, error)
	// KeepAliveOnce renews the lease once and returns the granted TTL, which
	// counts from no earlier than the moment KeepAliveOnce was called: an
	// implementation may send the request several times (through different
	// servers), but never before the call. A lease that no longer exists
	// yields ErrLeaseNotFound.
	KeepAliveOnce(ctx context.Context, id LeaseID) (time.Duration, error)
	// Revoke deletes the lease and every key attached to it. Revoking a
	// lease that does not exist yields ErrLeaseNotFound.
	Revoke(ctx context.Context, id LeaseID) error
	// LeaseKeys lists, read-only and in one request, the keys attached to
	// the lease, relative to the namespace ("shards/3"), in no particular
	// order. A lease that does not exist yields ErrLeaseNotFound.
	LeaseKeys(ctx context.Context, id LeaseID) ([]string, error)
}

// VerifyLease checks, without writing and in one store request whatever
// len(held) (l.LeaseKeys), that every held lock is still attached to
// lease, and returns those that are not, with Exists false (their keys
// are not read). It does not compare epochs: a lock rewritten under the
// same lease by another client is not reported (only the lease's holder
// writes under it). When the lease no longer exists, every held lock is
// returned.
func VerifyLease(ctx context.Context, l Leases, lease LeaseID, held []Held) ([]LostLock, error) {
	if err := CheckHeldBy(lease, held); err != nil {
		return nil, err
	}
	keys, err := l.LeaseKeys(ctx, lease)
	if err != nil && !errors.Is(err, ErrLeaseNotFound) {
		return nil, fmt.Errorf("verify %d locks by lease %x: %w", len(held), lease, err)
	}
	return LostFromKeys(keys, held), nil
}

// LostFromKeys returns the held locks whose keys are not among keys (a
// lease's attached keys, see VerifyLease), with Exists false.
func LostFromKeys(keys []string, held []Held) []LostLock {
	attached := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		attached[k] = struct{}{}
	}
	var lost []LostLock
	for _, h := range held {
		if _, ok := attached[LockKey(h.Shard)]; !ok {
			lost = append(lost, LostLock{Shard: h.Shard})
		}
	}
	return lost
}

// Registry publishes runner records. A record is claimed, never stolen:
// PutRunner writes only a key that is absent or already attached to the
// caller's lease; replacing anything else takes a decision by the caller
// (ReplaceRunner, conditional on the revision the caller read).
type Registry interface {
	// PutRunner writes runners/{rec.ID} attached to lease if the key is
	// absent or attached to lease, and returns the revision of the write.
	// Otherwise it writes nothing and returns a *RunnerConflictError
	// (ErrRunnerConflict) holding the key as found: the registration of
	// another process, or a damaged record.
	PutRunner(ctx context.Context, lease LeaseID, rec RunnerRecord) (Revision, error)
	// ReplaceRunner writes runners/{rec.ID} attached to lease if the key
	// still exists at revision rev (a record the caller read and decided to
	// replace), and returns the revision of the write. Otherwise it writes
	// nothing and returns a *RunnerConflictError holding the key as found.
	ReplaceRunner(ctx context.Context, lease LeaseID, rec RunnerRecord, rev Revision) (Revision, error)
}

// AcquireStatus is the per-shard outcome of [Locks.Acquire].
type AcquireStatus int

const (
	// Acquired: the lock was created for the caller's lease at Epoch.
	Acquired AcquireStatus = iota + 1
	// AlreadyOwned: the lock already existed under the caller's lease;
	// Epoch is its current epoch (unchanged).
	AlreadyOwned
	// HeldElsewhere: the lock exists under another lease; Holder describes it.
	HeldElsewhere
)

func (s AcquireStatus) String() string {
	switch s {
	case Acquired:
		return "acquired"
	case AlreadyOwned:
		return "already-owned"
	case HeldElsewhere:
		return "held-elsewhere"
	default:
		return "unknown"
	}
}

// AcquireResult is the outcome of acquiring one shard.
type AcquireResult struct {
	Shard  sharding.ShardID
	Status AcquireStatus
	Epoch  Epoch // for Acquired and AlreadyOwned
	// Holder is, for HeldElsewhere and AlreadyOwned, the lock as found
	// (Owner may be zero if the value is corrupt).
	Holder Lock
	// Replaced is, for Acquired, the lock without a lease that the
	// acquisition overwrote (Owner zero if its value was corrupt), or nil
	// when the key was absent.
	Replaced *Lock
}

// Held names a lock the caller believes it owns, at an epoch.
type Held struct {
	Shard sharding.ShardID
	Epoch Epoch
	// Tell, for Release only, names the runner to tell that the lock is
	// free (the shard's assignee): the release also writes
	// notices/{Tell}/{Shard} (NoticeReleased), under the caller's lease,
	// in the same transaction. "" tells nobody.
	Tell string
}

// LostLock reports a lock the caller no longer owns at the epoch it held.
type LostLock struct {
	Shard  sharding.ShardID
	Exists bool // the key exists (under another lease or at another epoch)
	Holder Lock // the current lock when Exists
}

// TransferRequest moves one lock from the caller's lease to a target lease.
type TransferRequest struct {
	Shard     sharding.ShardID
	From      string  // the caller's runner ID: the record is handoffs/{From}/{Shard}
	FromLease LeaseID // the caller's lease; it must hold the lock...
	FromEpoch Epoch   // ...at this epoch
	ToLease   LeaseID // the target's lease; it must hold handoffs/{From}/{Shard}...
	// HandoffRevision, if not 0, is the ModRevision the handoff record must
	// still have (the record the caller decided on, not a later one).
	HandoffRevision Revision
	ToOwner         Owner // the value written for the target
}

// Locks manages the shard locks shards/{shard}.
type Locks interface {
	// Acquire tries to create the lock of each shard under lease with value
	// owner. A key without a lease is never an ownership (it cannot expire
	// and no runner holds it): Acquire overwrites it, conditional in the
	// same transaction on the key still having no lease, and reports it in
	// AcquireResult.Replaced. Shards are split into transactions of
	// MaxShardsPerTxn. The results are in the order of shards. Duplicate
	// shards are invalid.
	Acquire(ctx context.Context, lease LeaseID, owner Owner, shards []sharding.ShardID) ([]AcquireResult, error)
	// Verify checks, without writing, that every held lock still exists
	// under lease at its epoch. It returns the locks that do not. Its cost
	// grows with len(held) (one transaction per MaxShardsPerTxn locks).
	Verify(ctx context.Context, lease LeaseID, held []Held) ([]LostLock, error)
	// Release deletes the locks that are attached to lease at the given
	// epochs and returns the shards it deleted; locks held by other leases,
	// or rewritten since (another epoch), are left alone, so a late release
	// can never delete a newer ownership. A deleted lock whose Held names
	// a runner to Tell also gets its notice, in the same transaction.
	Release(ctx context.Context, lease LeaseID, held []Held) ([]sharding.ShardID, error)
	// Rewrite re-writes each lock still attached to lease with value owner,
	// which gives it a new, larger epoch and kills the old one (used after
	// re-attachment). Locks no longer attached to lease are reported with
	// status HeldElsewhere or omitted when absent.
	Rewrite(ctx context.Context, lease LeaseID, owner Owner, shards []sharding.ShardID) ([]AcquireResult, error)
	// Transfer moves locks: for each request, if shards/{Shard} is attached
	// to FromLease at FromEpoch and handoffs/{From}/{Shard} is attached to
	// ToLease (at HandoffRevision if set), it writes shards/{Shard} =
	// ToOwner under ToLease, deletes the handoff record and writes the
	// target's notice notices/{ToOwner.RunnerID}/{Shard} (NoticeMoved,
	// under ToLease), atomically: the notice's revision is the new epoch. Requests are
	// split into transactions of MaxShardsPerTxn, each atomic on its own;
	// shards must be distinct. Results are in the order of reqs: Epoch is
	// the new epoch, or Err says why that shard did not move (ErrNotOwner
	// when the caller does not hold the lock at FromEpoch, ErrNoHandoff
	// when the target's record is missing or changed). A transaction that
	// fails as a whole gives each of its shards its error (ErrLeaseNotFound
	// when a target's lease does not exist: none of them moved; any other
	// error: they may or may not have moved), and the first such error is
	// also returned. Invalid requests fail the call with
	// ErrInvalidArgument before anything is written.
	Transfer(ctx context.Context, reqs []TransferRequest) ([]TransferResult, error)
}

// TransferResult is the outcome of one TransferRequest.
type TransferResult struct {
	Shard sharding.ShardID
	Epoch Epoch // the new owner's epoch when Err is nil
	Err   error
}

// HandoffPut is one record for [Handoffs.PutHandoffs].
type HandoffPut struct {
	Shard  sharding.ShardID
	Record HandoffRecord
}

// HandoffRef names one handoff record: handoffs/{From}/{Shard}.
type HandoffRef struct {
	Shard sharding.ShardID
	From  string
}

// HandoffResult is the outcome of one HandoffPut.
type HandoffResult struct {
	Shard    sharding.ShardID
	Revision Revision // of the write, when Err is nil
	Err      error    // a *HandoffConflictError, or the transaction's error
}

// Handoffs manages handoff records handoffs/{from}/{shard}: written by the
// new owner under its lease, keyed by the old owner (Record.From), which
// watches its own prefix (HandoffsFrom).
type Handoffs interface {
	// PutHandoffs creates each handoffs/{from}/{shard} under lease, or updates it
	// if it is already attached to lease; a record attached to another
	// lease is left alone and its result is a *HandoffConflictError.
	// Records are written in transactions of MaxShardsPerTxn, each atomic
	// on its own; shards must be distinct. Results are in the order of
	// puts. A transaction that fails gives each of its records its error,
	// and the first such error is also returned. Invalid records fail the
	// call with ErrInvalidArgument before anything is written.
	PutHandoffs(ctx context.Context, lease LeaseID, puts []HandoffPut) ([]HandoffResult, error)
	// DeleteHandoffs deletes each record that is attached to lease (others
	// are left alone) and returns the shards it deleted. Shards must be
	// distinct.
	DeleteHandoffs(ctx context.Context, lease LeaseID, refs []HandoffRef) ([]sharding.ShardID, error)
}

// PutHandoff writes one handoff record with h.PutHandoffs.
func PutHandoff(ctx context.Context, h Handoffs, lease LeaseID, shard sharding.ShardID, rec HandoffRecord) (Revision, error) {
	res, err := h.PutHandoffs(ctx, lease, []HandoffPut{{Shard: shard, Record: rec}})
	if len(res) != 1 {
		return 0, err
	}
	return res[0].Revision, res[0].Err
}

// DeleteHandoff deletes one handoff record with h.DeleteHandoffs and
// reports whether it did.
func DeleteHandoff(ctx context.Context, h Handoffs, lease LeaseID, ref HandoffRef) (bool, error) {
	deleted, err := h.DeleteHandoffs(ctx, lease, []HandoffRef{ref})
	return len(deleted) == 1, err
}

// TransferOne moves one lock with l.Transfer and returns its new epoch.
func TransferOne(ctx context.Context, l Locks, req TransferRequest) (Epoch, error) {
	res, err := l.Transfer(ctx, []TransferRequest{req})
	if len(res) != 1 {
		return 0, err
	}
	return res[0].Epoch, res[0].Err
}

// Checkpoint is the stored state of a shard, written under an epoch.
type Checkpoint struct {
	Data     []byte
	Epoch    Epoch    // the writer's epoch
	Revision Revision // revision of the write
}

// Checkpoints stores fenced checkpoints: one per shard (name "") and any
// number of named ones per shard (e.g. one per entity), all fenced by the
// shard's lock.
//
// A write or delete also names the revision prev it expects the checkpoint
// at (Checkpoint.Revision as read or returned by the last write; 0: none
// exists): a write whose outcome was unknown (ErrUnavailable: a timeout)
// may still be applied later, after a newer write of the same owner, and
// would then overwrite it; with prev it is refused instead, and the newer
// write, refused first if the older one landed before it, learns the
// current revision from the *CheckpointChangedError and writes again.
type Checkpoints interface {
	// WriteCheckpoint stores data under (shard, name) if epoch is the
	// current epoch of the shard's lock and the checkpoint is at revision
	// prev (AnyRevision: any), in the same transaction, and returns the
	// checkpoint's new revision. Otherwise it writes nothing and returns a
	// *FencedError (the lock is at another epoch) or a
	// *CheckpointChangedError (the checkpoint is at another revision).
	WriteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch Epoch, prev Revision, data []byte) (Revision, error)
	// ReadCheckpoint returns the last checkpoint of (shard, name); ok is
	// false when none was ever written.
	ReadCheckpoint(ctx context.Context, shard sharding.ShardID, name string) (cp Checkpoint, ok bool, err error)
	// DeleteCheckpoint deletes the checkpoint (shard, name), if there is
	// one, if epoch is the current epoch of the shard's lock and the
	// checkpoint is at revision prev (0: none exists, AnyRevision: any), in
	// the same transaction; otherwise it deletes nothing and returns a
	// *FencedError or a *CheckpointChangedError, as WriteCheckpoint.
	DeleteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch Epoch, prev Revision) error
}

// AnyRevision, as the prev of WriteCheckpoint or DeleteCheckpoint, accepts
// the checkpoint at whatever revision it is (tools and tests; a write in
// flight may then overtake a later one: the runner never uses it).
const AnyRevision Revision = -1

// Key is the key of name in keyspace ks relative to the namespace:
// "runners/{id}", "shards/{shard}", "handoffs/{shard}".
func Key(ks Keyspace, name string) string { return string(ks) + "/" + name }

// LockKey is the key of shard's lock relative to the namespace.
func LockKey(shard sharding.ShardID) string { return Key(KeyspaceShards, shard.String()) }

// HandoffKey is the key of the handoff record of shard from runner from
// (its old owner) relative to the namespace: "handoffs/{from}/{shard}".
func HandoffKey(from string, shard sharding.ShardID) string {
	return Key(HandoffsFrom(from), shard.String())
}

// HandoffsFrom is the keyspace of the handoff records of shards owned by
// runner from (their key names are shard numbers): what that runner
// watches.
func HandoffsFrom(from string) Keyspace { return Keyspace(string(KeyspaceHandoffs) + "/" + from) }

// DefaultOpTimeout bounds a store call whose context has no earlier
// deadline (both implementations).
const DefaultOpTimeout = 5 * time.Second

// WithOpTimeout bounds ctx by d unless it already ends within d.
func WithOpTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= d {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// CheckRevision reports an ErrInvalidArgument for a revision that is not
// positive (etcd compares the revision of a missing key as 0).
func CheckRevision(rev Revision) error {
	if rev <= 0 {
		return fmt.Errorf("%w: revision %d, want > 0", ErrInvalidArgument, rev)
	}
	return nil
}

// CheckTTL reports an ErrInvalidArgument for a lease TTL that is not
// positive.
func CheckTTL(ttl time.Duration) error {
	if ttl <= 0 {
		return fmt.Errorf("%w: lease TTL %v", ErrInvalidArgument, ttl)
	}
	return nil
}

// CheckpointKey is the key of checkpoint (shard, name) relative to the
// namespace: "checkpoints/{shard}" for the shard-level checkpoint,
// "checkpoints/{shard}/{path-escaped name}" for a named one.
func CheckpointKey(shard sharding.ShardID, name string) string {
	if name == "" {
		return "checkpoints/" + shard.String()
	}
	return "checkpoints/" + shard.String() + "/" + url.PathEscape(name)
}

// Keyspace names one family of keys that can be listed and watched.
type Keyspace string

// The key families.
const (
	KeyspaceRunners  Keyspace = "runners"
	KeyspaceShards   Keyspace = "shards"
	KeyspaceHandoffs Keyspace = "handoffs" // handoffs/{from}/{shard}: see HandoffsFrom
	KeyspaceNotices  Keyspace = "notices"  // notices/{to}/{shard}: see NoticesTo
)

// KeyValue is one key of a keyspace as stored. Key is the name within the
// keyspace (a runner ID, or a shard number in decimal).
type KeyValue struct {
	Key            string
	Value          []byte
	Lease          LeaseID
	CreateRevision Revision
	ModRevision    Revision
}

// EventType says whether a key was written or deleted.
type EventType int

// Event types.
const (
	EventPut EventType = iota + 1
	EventDelete
)

func (t EventType) String() string {
	switch t {
	case EventPut:
		return "PUT"
	case EventDelete:
		return "DELETE"
	default:
		return "UNKNOWN"
	}
}

// Event is one change of a key. For a DELETE, KV holds only Key and
// ModRevision (the revision of the deletion).
type Event struct {
	Type EventType
	KV   KeyValue
}

// Snapshot is the content of a keyspace at one revision.
type Snapshot struct {
	Revision Revision
	KVs      []KeyValue
}

// WatchResponse carries the events of one or more revisions, in order. A
// response with Err set is the last on its channel.
type WatchResponse struct {
	Events []Event
	Err    error // ErrCompacted if the start revision is gone; ErrUnavailable otherwise
}

// Lister lists and watches keyspaces.
type Lister interface {
	// List returns every key of ks at one revision.
	List(ctx context.Context, ks Keyspace) (Snapshot, error)
	// Watch delivers every change of ks at revisions >= from, in order,
	// until ctx is done (then the channel is closed) or the watch fails
	// (then one response with Err is sent and the channel is closed).
	Watch(ctx context.Context, ks Keyspace, from Revision) <-chan WatchResponse
	// WatchKey is Watch for one key (relative to the namespace, e.g.
	// LockKey(3)); the events' KV.Key is its name within its keyspace
	// ("3").
	WatchKey(ctx context.Context, key string, from Revision) <-chan WatchResponse
}

// KeyspaceOf splits a key relative to the namespace into its keyspace (all
// but its last segment) and its name (the last one).
func KeyspaceOf(key string) (Keyspace, string) {
	i := strings.LastIndexByte(key, '/')
	if i < 0 {
		return "", key
	}
	return Keyspace(key[:i]), key[i+1:]
}

// Store is everything shardhost needs from its coordination store.
type Store interface {
	Leases
	Registry
	Locks
	Handoffs
	Notices
	Checkpoints
	ShardStates
	Clusters
	Lister
	// Ping performs a linearizable read: it succeeds only if the store can
	// currently serve consistent requests to this client.
	Ping(ctx context.Context) error
}
