// Package storagetest is the conformance suite of storage.Store: every
// implementation runs the same tests (like testing/fstest.TestFS), so the
// in-memory store used by fast unit tests behaves like etcd where it matters.
//
// The suite uses real time: lease expiry tests wait about two seconds (etcd
// does not grant leases shorter than about 2 s with fast test settings).
// Subtests run in parallel, each on a fresh, empty store.
package storagetest

import (
	"context"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Instance is one fresh, empty store and raw access to it for tests.
type Instance struct {
	Store storage.Store
	// RawPut writes key (relative to the store's namespace, e.g.
	// "shards/3") with value and lease, bypassing every check: it simulates
	// other writers and corrupt values.
	RawPut func(ctx context.Context, key string, value []byte, lease storage.LeaseID) error
	// RawRevision returns the revision key (relative to the namespace) was
	// last written at, and whether it exists.
	RawRevision func(ctx context.Context, key string) (storage.Revision, bool, error)
	// RawDelete deletes key (relative to the namespace) unconditionally.
	RawDelete func(ctx context.Context, key string) error
	// Compact discards history before rev.
	Compact func(ctx context.Context, rev storage.Revision) error
}

// Harness creates instances of the implementation under test.
type Harness struct {
	// New returns a fresh, empty, isolated store. It registers its own
	// cleanup with t.
	New func(t *testing.T) Instance
}

// Run runs the conformance suite.
func Run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, in Instance)
	}{
		{"Leases", testLeases},
		{"AcquireLargeBatch", testAcquireLargeBatch},
		{"HeldElsewhere", testHeldElsewhere},
		{"IncarnationIsNotOwnership", testIncarnation},
		{"ReleaseOnlyByOwner", testRelease},
		{"VerifyIsReadOnly", testVerify},
		{"LeaseKeysListWhatIsAttached", testLeaseKeys},
		{"Rewrite", testRewrite},
		{"Transfer", testTransfer},
		{"TransferBatch", testTransferBatch},
		{"Handoffs", testHandoffs},
		{"HandoffsBatch", testHandoffsBatch},
		{"NoticesAreDeletedOnlyAsApplied", testNotices},
		{"LeaseExpiryDeletesKeys", testLeaseExpiry},
		{"WatchAfterListNoGaps", testWatchNoGaps},
		{"WatchKeySeesThatKeyOnly", testWatchKey},
		{"FollowConcurrentWrites", testFollowConcurrent},
		{"FencedCheckpoint", testCheckpoints},
		{"CorruptValues", testCorrupt},
		{"CorruptCheckpoints", testCorruptCheckpoints},
		{"FencedCheckpointDelete", testDeleteCheckpoint},
		{"CheckpointWritesAreOrdered", testCheckpointWritesAreOrdered},
		{"ShardStateWritesAreOrdered", testShardStateWritesAreOrdered},
		{"ShardStateIsFencedAndPerShard", testShardStateFenced},
		{"ShardStateInBatches", testShardStateBatches},
		{"ShardStateSkipsCorruptRecords", testShardStateCorrupt},
		{"SingletonRecordsAreFenced", testSingletonRecords},
		{"ClusterRecordWrittenOnce", testClusterRecord},
		{"RunnerRecordIsClaimedNotStolen", testRunnerClaims},
		{"LeaselessLockIsTakenOver", testLeaselessLock},
		{"InvalidArguments", testInvalid},
		{"CancelledContext", testCancelled},
	}
	t.Run("group", func(t *testing.T) {
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				tc.fn(t, h.New(t))
			})
		}
	})
	// Compaction is store-wide on etcd: run it alone, after the others.
	t.Run("Compaction", func(t *testing.T) { testCompaction(t, h.New(t)) })
}

const opTimeout = 10 * time.Second

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	t.Cleanup(cancel)
	return ctx
}

func grant(t *testing.T, s storage.Store, ttl time.Duration) storage.LeaseID {
	t.Helper()
	l, err := s.Grant(ctxT(t), ttl)
	if err != nil {
		t.Fatalf("Grant(%v) = %v", ttl, err)
	}
	if l.ID == storage.NoLease || l.TTL < ttl {
		t.Fatalf("Grant(%v) = %+v, want an ID and TTL >= %v", ttl, l, ttl)
	}
	return l.ID
}

func owner(id, inc string) storage.Owner { return storage.Owner{RunnerID: id, Incarnation: inc} }

func shardRange(lo, hi int) []sharding.ShardID {
	var out []sharding.ShardID
	for i := lo; i < hi; i++ {
		out = append(out, sharding.ShardID(i))
	}
	return out
}

func acquire(t *testing.T, s storage.Store, l storage.LeaseID, o storage.Owner, shards ...sharding.ShardID) []storage.AcquireResult {
	t.Helper()
	res, err := s.Acquire(ctxT(t), l, o, shards)
	if err != nil {
		t.Fatalf("Acquire(%v) = %v", shards, err)
	}
	if len(res) != len(shards) {
		t.Fatalf("Acquire(%v) returned %d results, want %d", shards, len(res), len(shards))
	}
	for i, r := range res {
		if r.Shard != shards[i] {
			t.Fatalf("Acquire result %d is for shard %d, want %d", i, r.Shard, shards[i])
		}
	}
	return res
}

func locks(t *testing.T, s storage.Store) (map[sharding.ShardID]storage.Lock, storage.Revision) {
	t.Helper()
	snap, err := s.List(ctxT(t), storage.KeyspaceShards)
	if err != nil {
		t.Fatalf("List(shards) = %v", err)
	}
	out := make(map[sharding.ShardID]storage.Lock)
	for _, kv := range snap.KVs {
		l, err := storage.DecodeLock(kv)
		if err != nil {
			t.Fatalf("DecodeLock(%q) = %v", kv.Key, err)
		}
		out[l.Shard] = l
	}
	return out, snap.Revision
}
