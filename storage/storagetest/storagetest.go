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
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
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
		{"Rewrite", testRewrite},
		{"Transfer", testTransfer},
		{"TransferBatch", testTransferBatch},
		{"Handoffs", testHandoffs},
		{"HandoffsBatch", testHandoffsBatch},
		{"LeaseExpiryDeletesKeys", testLeaseExpiry},
		{"WatchAfterListNoGaps", testWatchNoGaps},
		{"FollowConcurrentWrites", testFollowConcurrent},
		{"FencedCheckpoint", testCheckpoints},
		{"CorruptValues", testCorrupt},
		{"CorruptCheckpoints", testCorruptCheckpoints},
		{"FencedCheckpointDelete", testDeleteCheckpoint},
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

func testLeases(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	id := grant(t, s, 5*time.Second)
	ttl, err := s.KeepAliveOnce(ctx, id)
	if err != nil || ttl < 5*time.Second {
		t.Fatalf("KeepAliveOnce = %v, %v; want >= 5s, nil", ttl, err)
	}
	if err := s.Revoke(ctx, id); err != nil {
		t.Fatalf("Revoke = %v", err)
	}
	if _, err := s.KeepAliveOnce(ctx, id); !errors.Is(err, storage.ErrLeaseNotFound) {
		t.Fatalf("KeepAliveOnce(revoked) = %v, want ErrLeaseNotFound", err)
	}
	if err := s.Revoke(ctx, id); !errors.Is(err, storage.ErrLeaseNotFound) {
		t.Fatalf("Revoke(revoked) = %v, want ErrLeaseNotFound", err)
	}
	if _, err := s.PutRunner(ctx, id, storage.RunnerRecord{ID: "r", Incarnation: "i", Weight: 1}); !errors.Is(err, storage.ErrLeaseNotFound) {
		t.Fatalf("PutRunner(revoked lease) = %v, want ErrLeaseNotFound", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping = %v", err)
	}
}

func testAcquireLargeBatch(t *testing.T, in Instance) {
	s := in.Store
	l := grant(t, s, 30*time.Second)
	shards := shardRange(0, 300)
	res := acquire(t, s, l, owner("a", "1"), shards...)
	epochs := map[storage.Epoch]int{}
	for _, r := range res {
		if r.Status != storage.Acquired || r.Epoch <= 0 {
			t.Fatalf("Acquire shard %d = %v epoch %d, want acquired with an epoch", r.Shard, r.Status, r.Epoch)
		}
		epochs[r.Epoch]++
	}
	// 300 shards in transactions of at most MaxShardsPerTxn.
	if want := (300 + storage.MaxShardsPerTxn - 1) / storage.MaxShardsPerTxn; len(epochs) < want {
		t.Errorf("300 shards acquired at %d revisions (%v), want >= %d transactions", len(epochs), epochs, want)
	}
	for e, n := range epochs {
		if n > storage.MaxShardsPerTxn {
			t.Errorf("%d shards acquired in the transaction at revision %d, want <= %d", n, e, storage.MaxShardsPerTxn)
		}
	}
	got, _ := locks(t, s)
	if len(got) != 300 {
		t.Fatalf("listed %d locks, want 300", len(got))
	}
	for _, r := range res {
		if l2 := got[r.Shard]; l2.Lease != l || l2.Epoch != r.Epoch || l2.Owner != owner("a", "1") {
			t.Fatalf("lock %d = %+v, want lease %x epoch %d", r.Shard, l2, l, r.Epoch)
		}
	}
	// Verify all 300 (several batches), then release all 300.
	held := make([]storage.Held, len(res))
	for i, r := range res {
		held[i] = storage.Held{Shard: r.Shard, Epoch: r.Epoch}
	}
	if lost, err := s.Verify(ctxT(t), l, held); err != nil || len(lost) != 0 {
		t.Fatalf("Verify(300) = %v, %v; want none lost", lost, err)
	}
	rel, err := s.Release(ctxT(t), l, held)
	if err != nil || len(rel) != 300 {
		t.Fatalf("Release(300) = %d shards, %v; want 300", len(rel), err)
	}
	if got, _ := locks(t, s); len(got) != 0 {
		t.Fatalf("after release %d locks remain", len(got))
	}
}

func testHeldElsewhere(t *testing.T, in Instance) {
	s := in.Store
	la, lb := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	ra := acquire(t, s, la, owner("a", "1"), 1, 2)
	rb := acquire(t, s, lb, owner("b", "1"), 1, 2, 3)
	for i, r := range rb[:2] {
		if r.Status != storage.HeldElsewhere {
			t.Fatalf("Acquire(B, %d) = %v, want held-elsewhere", r.Shard, r.Status)
		}
		want := storage.Lock{Shard: r.Shard, Owner: owner("a", "1"), Lease: la, Epoch: ra[i].Epoch}
		if r.Holder != want {
			t.Errorf("Acquire(B, %d).Holder = %+v, want %+v", r.Shard, r.Holder, want)
		}
	}
	if rb[2].Status != storage.Acquired {
		t.Fatalf("Acquire(B, 3) = %v, want acquired", rb[2].Status)
	}
	again := acquire(t, s, la, owner("a", "1"), 1, 3)
	if again[0].Status != storage.AlreadyOwned || again[0].Epoch != ra[0].Epoch {
		t.Errorf("Acquire(A, 1) again = %v epoch %d, want already-owned epoch %d", again[0].Status, again[0].Epoch, ra[0].Epoch)
	}
	if again[1].Status != storage.HeldElsewhere || again[1].Holder.Lease != lb {
		t.Errorf("Acquire(A, 3) = %+v, want held by lease %x", again[1], lb)
	}
}

func testIncarnation(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	old, cur := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	if _, err := s.PutRunner(ctx, old, storage.RunnerRecord{ID: "r1", Incarnation: "old", Weight: 1}); err != nil {
		t.Fatal(err)
	}
	r := acquire(t, s, old, owner("r1", "old"), 5)[0]
	// The new incarnation has the same runner ID but a new lease: it cannot
	// claim the record while the old lease holds it.
	_, err := s.PutRunner(ctx, cur, storage.RunnerRecord{ID: "r1", Incarnation: "new", Weight: 1})
	var ce *storage.RunnerConflictError
	if !errors.As(err, &ce) || !errors.Is(err, storage.ErrRunnerConflict) || !ce.Exists || ce.Existing.Lease != old {
		t.Fatalf("PutRunner(new incarnation) = %v, want a *RunnerConflictError naming lease %x", err, old)
	}
	if rr, err := storage.DecodeRunner(ce.Existing); err != nil || rr.Incarnation != "old" {
		t.Fatalf("conflicting record = %+v, %v; want the old incarnation's", rr, err)
	}
	if got := acquire(t, s, cur, owner("r1", "new"), 5)[0]; got.Status != storage.HeldElsewhere || got.Holder.Lease != old {
		t.Fatalf("new incarnation Acquire(5) = %+v, want held elsewhere by the old lease", got)
	}
	if lost, err := s.Verify(ctx, cur, []storage.Held{{Shard: 5, Epoch: r.Epoch}}); err != nil || len(lost) != 1 {
		t.Fatalf("new incarnation Verify(5 at old epoch) = %v, %v; want lost", lost, err)
	}
	if rel, err := s.Release(ctx, cur, []storage.Held{{Shard: 5, Epoch: r.Epoch}}); err != nil || len(rel) != 0 {
		t.Fatalf("new incarnation Release(5) = %v, %v; want nothing released", rel, err)
	}
	if got, _ := locks(t, s); got[5].Lease != old {
		t.Fatalf("lock 5 = %+v, want still under the old lease", got[5])
	}
	// Revoking the old lease deletes the old incarnation's locks and record;
	// then the new incarnation registers.
	if err := s.Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRunner(ctx, cur, storage.RunnerRecord{ID: "r1", Incarnation: "new", Weight: 1}); err != nil {
		t.Fatalf("PutRunner(new incarnation) after the old lease ended = %v", err)
	}
	snap, err := s.List(ctx, storage.KeyspaceRunners)
	if err != nil || len(snap.KVs) != 1 {
		t.Fatalf("List(runners) = %v, %v; want 1 record", snap.KVs, err)
	}
	if rr, err := storage.DecodeRunner(snap.KVs[0]); err != nil || rr.Incarnation != "new" || rr.Lease != cur {
		t.Fatalf("runner record = %+v, %v; want the new incarnation under lease %x", rr, err, cur)
	}
	got := acquire(t, s, cur, owner("r1", "new"), 5)[0]
	if got.Status != storage.Acquired || got.Epoch <= r.Epoch {
		t.Fatalf("Acquire(5) after the old lease ended = %+v, want acquired at an epoch > %d", got, r.Epoch)
	}
}

func testRelease(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	la, lb := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	ra := acquire(t, s, la, owner("a", "1"), 1, 2)
	rb := acquire(t, s, lb, owner("b", "1"), 3)
	_, rev := locks(t, s)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := s.Watch(wctx, storage.KeyspaceShards, rev+1)
	// Only A's lock at A's epoch goes: not B's, not A's at a stale epoch,
	// not an absent one.
	rel, err := s.Release(ctx, la, []storage.Held{{Shard: 1, Epoch: ra[0].Epoch}, {Shard: 2, Epoch: ra[1].Epoch - 1}, {Shard: 3, Epoch: rb[0].Epoch}, {Shard: 9, Epoch: 1}})
	if err != nil || !slices.Equal(rel, []sharding.ShardID{1}) {
		t.Fatalf("Release(A, [1 2(stale) 3 9]) = %v, %v; want [1]", rel, err)
	}
	got, _ := locks(t, s)
	if _, ok := got[1]; ok || got[2].Lease != la || got[3].Lease != lb {
		t.Fatalf("locks after release = %v", got)
	}
	ev := nextEvents(t, w, 1)[0]
	if ev.Type != storage.EventDelete || ev.KV.Key != "1" {
		t.Fatalf("watch after release = %+v, want DELETE of 1", ev)
	}
}

func nextEvents(t *testing.T, w <-chan storage.WatchResponse, n int) []storage.Event {
	t.Helper()
	var out []storage.Event
	timeout := time.After(opTimeout)
	for len(out) < n {
		select {
		case r, ok := <-w:
			if !ok {
				t.Fatalf("watch closed after %d of %d events", len(out), n)
			}
			if r.Err != nil {
				t.Fatalf("watch failed after %d of %d events: %v", len(out), n, r.Err)
			}
			out = append(out, r.Events...)
		case <-timeout:
			t.Fatalf("got %d of %d watch events (%+v) within %v", len(out), n, out, opTimeout)
		}
	}
	return out
}

func testVerify(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l, other := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	res := acquire(t, s, l, owner("a", "1"), shardRange(0, 200)...)
	held := make([]storage.Held, len(res))
	for i, r := range res {
		held[i] = storage.Held{Shard: r.Shard, Epoch: r.Epoch}
	}
	// Read-only: no lock is rewritten (the store-wide revision may move
	// with other tests sharing the store).
	before, _ := locks(t, s)
	for range 3 {
		if lost, err := s.Verify(ctx, l, held); err != nil || len(lost) != 0 {
			t.Fatalf("Verify = %v, %v; want none lost", lost, err)
		}
	}
	after, _ := locks(t, s)
	for id, lk := range before {
		if after[id] != lk {
			t.Fatalf("Verify wrote lock %d: %+v -> %+v", id, lk, after[id])
		}
	}
	// Behind our back: one lock deleted, one taken by another lease.
	if err := in.RawDelete(ctx, "shards/7"); err != nil {
		t.Fatal(err)
	}
	val, _ := storage.EncodeOwner(owner("thief", "1"))
	if err := in.RawPut(ctx, "shards/150", val, other); err != nil {
		t.Fatal(err)
	}
	lost, err := s.Verify(ctx, l, held)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(lost, func(a, b storage.LostLock) int { return int(a.Shard) - int(b.Shard) })
	if len(lost) != 2 || lost[0].Shard != 7 || lost[0].Exists || lost[1].Shard != 150 || !lost[1].Exists || lost[1].Holder.Lease != other {
		t.Fatalf("Verify after interference = %+v, want 7 gone and 150 held by lease %x", lost, other)
	}
}

func testRewrite(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l, other := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	res := acquire(t, s, l, owner("a", "1"), 1, 2)
	acquire(t, s, other, owner("b", "1"), 3)
	out, err := s.Rewrite(ctx, l, owner("a", "1"), []sharding.ShardID{1, 2, 3, 4})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 3 {
		t.Fatalf("Rewrite = %+v, want results for 1, 2 (rewritten) and 3 (held elsewhere)", out)
	}
	for i, r := range out[:2] {
		if r.Status != storage.Acquired || r.Epoch <= res[i].Epoch {
			t.Errorf("Rewrite(%d) = %+v, want a new epoch > %d", r.Shard, r, res[i].Epoch)
		}
		if _, err := s.WriteCheckpoint(ctx, r.Shard, "", res[i].Epoch, []byte("x")); !errors.Is(err, storage.ErrFenced) {
			t.Errorf("checkpoint at the pre-rewrite epoch = %v, want ErrFenced", err)
		}
		if _, err := s.WriteCheckpoint(ctx, r.Shard, "", r.Epoch, []byte("x")); err != nil {
			t.Errorf("checkpoint at the rewritten epoch = %v", err)
		}
	}
	if out[2].Status != storage.HeldElsewhere || out[2].Holder.Lease != other {
		t.Errorf("Rewrite(3) = %+v, want held elsewhere", out[2])
	}
}

func testTransfer(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	la, lb := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	r := acquire(t, s, la, owner("a", "1"), 4)[0]
	req := storage.TransferRequest{Shard: 4, FromLease: la, FromEpoch: r.Epoch, ToLease: lb, ToOwner: owner("b", "1")}
	if _, err := storage.TransferOne(ctx, s, req); !errors.Is(err, storage.ErrNoHandoff) {
		t.Fatalf("Transfer without a handoff record = %v, want ErrNoHandoff", err)
	}
	hrev, err := storage.PutHandoff(ctx, s, lb, 4, storage.HandoffRecord{From: "a", To: "b", Phase: storage.HandoffWarming})
	if err != nil {
		t.Fatal(err)
	}
	// A record rewritten since the caller looked at it does not count.
	if _, err := storage.PutHandoff(ctx, s, lb, 4, storage.HandoffRecord{From: "a", To: "b", Phase: storage.HandoffReady}); err != nil {
		t.Fatal(err)
	}
	old := req
	old.HandoffRevision = hrev
	if _, err := storage.TransferOne(ctx, s, old); !errors.Is(err, storage.ErrNoHandoff) {
		t.Fatalf("Transfer against a superseded handoff record = %v, want ErrNoHandoff", err)
	}
	stale := req
	stale.FromEpoch--
	if _, err := storage.TransferOne(ctx, s, stale); !errors.Is(err, storage.ErrNotOwner) {
		t.Fatalf("Transfer at a stale epoch = %v, want ErrNotOwner", err)
	}
	notMine := req
	notMine.FromLease = lb
	if _, err := storage.TransferOne(ctx, s, notMine); !errors.Is(err, storage.ErrNotOwner) {
		t.Fatalf("Transfer by a non-owner = %v, want ErrNotOwner", err)
	}
	epoch, err := storage.TransferOne(ctx, s, req)
	if err != nil || epoch <= r.Epoch {
		t.Fatalf("Transfer = %d, %v; want an epoch > %d", epoch, err, r.Epoch)
	}
	got, _ := locks(t, s)
	if got[4].Lease != lb || got[4].Epoch != epoch || got[4].Owner != owner("b", "1") {
		t.Fatalf("lock 4 after transfer = %+v", got[4])
	}
	snap, err := s.List(ctx, storage.KeyspaceHandoffs)
	if err != nil || len(snap.KVs) != 0 {
		t.Fatalf("handoffs after transfer = %v, %v; want none", snap.KVs, err)
	}
	if lost, err := s.Verify(ctx, la, []storage.Held{{Shard: 4, Epoch: r.Epoch}}); err != nil || len(lost) != 1 {
		t.Fatalf("old owner Verify = %v, %v; want lost", lost, err)
	}
	if lost, err := s.Verify(ctx, lb, []storage.Held{{Shard: 4, Epoch: epoch}}); err != nil || len(lost) != 0 {
		t.Fatalf("new owner Verify = %v, %v; want held", lost, err)
	}
	if _, err := storage.TransferOne(ctx, s, req); !errors.Is(err, storage.ErrNotOwner) {
		t.Fatalf("second Transfer = %v, want ErrNotOwner", err)
	}
}

// testTransferBatch moves 150 locks (three transactions) in one call, with
// failures mixed in: each shard gets its own outcome, results keep the
// order of the requests, and a failed shard does not hold back the others.
func testTransferBatch(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	la, lb := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	const n = 150
	res := acquire(t, s, la, owner("a", "1"), shardRange(0, n)...)
	var puts []storage.HandoffPut
	reqs := make([]storage.TransferRequest, n)
	for i := range n {
		reqs[i] = storage.TransferRequest{Shard: sharding.ShardID(i), FromLease: la, FromEpoch: res[i].Epoch, ToLease: lb, ToOwner: owner("b", "1")}
		if i%10 != 3 { // shards 3, 13, ...: no handoff record
			puts = append(puts, storage.HandoffPut{Shard: sharding.ShardID(i), Record: storage.HandoffRecord{From: "a", To: "b", Phase: storage.HandoffReady}})
		}
		if i%10 == 7 { // shards 7, 17, ...: a stale epoch
			reqs[i].FromEpoch--
		}
	}
	// Requests out of shard order: results follow the requests.
	slices.Reverse(reqs)
	if out, err := s.PutHandoffs(ctx, lb, puts); err != nil || len(out) != len(puts) {
		t.Fatalf("PutHandoffs(%d) = %d results, %v", len(puts), len(out), err)
	}
	out, err := s.Transfer(ctx, reqs)
	if err != nil || len(out) != n {
		t.Fatalf("Transfer(%d) = %d results, %v", n, len(out), err)
	}
	got, _ := locks(t, s)
	moved := 0
	for i, r := range out {
		req := reqs[i]
		var want error
		switch req.Shard % 10 {
		case 3:
			want = storage.ErrNoHandoff
		case 7:
			want = storage.ErrNotOwner
		}
		switch {
		case r.Shard != req.Shard:
			t.Fatalf("result %d is for shard %d, want %d", i, r.Shard, req.Shard)
		case want != nil && !errors.Is(r.Err, want):
			t.Errorf("shard %d: %v, want %v", r.Shard, r.Err, want)
		case want == nil && (r.Err != nil || r.Epoch <= req.FromEpoch || got[r.Shard].Lease != lb || got[r.Shard].Epoch != r.Epoch):
			t.Errorf("shard %d: %+v, lock %+v; want moved to lease %x", r.Shard, r, got[r.Shard], lb)
		case want == nil:
			moved++
		case got[r.Shard].Lease != la:
			t.Errorf("shard %d failed but its lock is %+v", r.Shard, got[r.Shard])
		}
	}
	if moved != 120 {
		t.Errorf("%d shards moved, want 120", moved)
	}
	if _, err := s.Transfer(ctx, []storage.TransferRequest{reqs[0], reqs[0]}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Errorf("Transfer of one shard twice = %v, want ErrInvalidArgument", err)
	}
}

// testHandoffsBatch writes and deletes 100 handoff records (two
// transactions) in one call each, with conflicts mixed in.
func testHandoffsBatch(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	lb, lc := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	const n = 100
	if _, err := storage.PutHandoff(ctx, s, lc, 42, storage.HandoffRecord{From: "a", To: "c", Phase: storage.HandoffWarming}); err != nil {
		t.Fatal(err)
	}
	puts := make([]storage.HandoffPut, n)
	for i := range n {
		puts[i] = storage.HandoffPut{Shard: sharding.ShardID(i), Record: storage.HandoffRecord{From: "a", To: "b", Phase: storage.HandoffWarming}}
	}
	out, err := s.PutHandoffs(ctx, lb, puts)
	if err != nil || len(out) != n {
		t.Fatalf("PutHandoffs(%d) = %d results, %v", n, len(out), err)
	}
	for i, r := range out {
		var conflict *storage.HandoffConflictError
		switch {
		case r.Shard != sharding.ShardID(i):
			t.Fatalf("result %d is for shard %d", i, r.Shard)
		case i == 42 && (!errors.As(r.Err, &conflict) || conflict.Existing.To != "c"):
			t.Errorf("shard 42 (c's record) = %+v, want a *HandoffConflictError naming c", r)
		case i != 42 && (r.Err != nil || r.Revision == 0):
			t.Errorf("shard %d = %+v, want written", i, r)
		}
	}
	// Update to ready in one call: records under lb are updated.
	for i := range puts {
		puts[i].Record.Phase = storage.HandoffReady
	}
	if out, err := s.PutHandoffs(ctx, lb, puts); err != nil || out[0].Err != nil || out[99].Err != nil {
		t.Fatalf("PutHandoffs(ready) = %v, %v", out, err)
	}
	snap, err := s.List(ctx, storage.KeyspaceHandoffs)
	if err != nil || len(snap.KVs) != n {
		t.Fatalf("List(handoffs) = %d keys, %v; want %d", len(snap.KVs), err, n)
	}
	for _, kv := range snap.KVs {
		h, err := storage.DecodeHandoff(kv)
		if err != nil || (h.Shard == 42) != (h.Lease == lc) || (h.Shard != 42 && h.Phase != storage.HandoffReady) {
			t.Errorf("record %+v, %v", h, err)
		}
	}
	deleted, err := s.DeleteHandoffs(ctx, lb, shardRange(0, n))
	if err != nil || len(deleted) != n-1 || slices.Contains(deleted, 42) {
		t.Fatalf("DeleteHandoffs = %d deleted (42 among them: %v), %v; want %d, not c's", len(deleted), slices.Contains(deleted, 42), err, n-1)
	}
	if snap, err := s.List(ctx, storage.KeyspaceHandoffs); err != nil || len(snap.KVs) != 1 {
		t.Fatalf("after DeleteHandoffs: %d records, %v; want c's only", len(snap.KVs), err)
	}
	if _, err := s.PutHandoffs(ctx, lb, []storage.HandoffPut{puts[0], puts[0]}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Errorf("PutHandoffs of one shard twice = %v, want ErrInvalidArgument", err)
	}
}

func testHandoffs(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	lb, lc := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	rec := storage.HandoffRecord{From: "a", To: "b", Phase: storage.HandoffWarming, FromEpoch: 7}
	if _, err := storage.PutHandoff(ctx, s, lb, 9, rec); err != nil {
		t.Fatal(err)
	}
	var conflict *storage.HandoffConflictError
	if _, err := storage.PutHandoff(ctx, s, lc, 9, storage.HandoffRecord{From: "a", To: "c", Phase: storage.HandoffWarming}); !errors.As(err, &conflict) || conflict.Existing.To != "b" || conflict.Existing.Lease != lb {
		t.Fatalf("PutHandoff by another lease = %v, want *HandoffConflictError naming b", err)
	}
	rec.Phase = storage.HandoffReady
	if _, err := storage.PutHandoff(ctx, s, lb, 9, rec); err != nil {
		t.Fatalf("PutHandoff update by its lease = %v", err)
	}
	snap, err := s.List(ctx, storage.KeyspaceHandoffs)
	if err != nil || len(snap.KVs) != 1 {
		t.Fatalf("List(handoffs) = %v, %v", snap.KVs, err)
	}
	h, err := storage.DecodeHandoff(snap.KVs[0])
	if err != nil || h.HandoffRecord != rec || h.Shard != 9 || h.Lease != lb {
		t.Fatalf("handoff = %+v, %v; want %+v under lease %x", h, err, rec, lb)
	}
	if ok, err := storage.DeleteHandoff(ctx, s, lc, 9); err != nil || ok {
		t.Fatalf("DeleteHandoff by another lease = %v, %v; want false", ok, err)
	}
	if ok, err := storage.DeleteHandoff(ctx, s, lb, 9); err != nil || !ok {
		t.Fatalf("DeleteHandoff by its lease = %v, %v; want true", ok, err)
	}
	// A handoff record vanishes with its lease.
	if _, err := storage.PutHandoff(ctx, s, lc, 10, storage.HandoffRecord{From: "a", To: "c", Phase: storage.HandoffWarming}); err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke(ctx, lc); err != nil {
		t.Fatal(err)
	}
	if snap, err := s.List(ctx, storage.KeyspaceHandoffs); err != nil || len(snap.KVs) != 0 {
		t.Fatalf("handoffs after revoke = %v, %v; want none", snap.KVs, err)
	}
}

func testLeaseExpiry(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l, err := s.Grant(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRunner(ctx, l.ID, storage.RunnerRecord{ID: "dying", Incarnation: "1", Weight: 1}); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, l.ID, owner("dying", "1"), 1, 2, 3)
	_, rev := locks(t, s)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	shardsW := s.Watch(wctx, storage.KeyspaceShards, rev+1)
	runnersW := s.Watch(wctx, storage.KeyspaceRunners, rev+1)
	start := time.Now()
	evs := nextEvents(t, shardsW, 3)
	rev2 := nextEvents(t, runnersW, 1)
	t.Logf("lease of TTL %v expired after %v", l.TTL, time.Since(start))
	var deleted []string
	for _, e := range evs {
		if e.Type != storage.EventDelete {
			t.Fatalf("event %+v, want DELETE", e)
		}
		deleted = append(deleted, e.KV.Key)
	}
	slices.Sort(deleted)
	if !slices.Equal(deleted, []string{"1", "2", "3"}) {
		t.Fatalf("deleted %v, want [1 2 3]", deleted)
	}
	if rev2[0].Type != storage.EventDelete || rev2[0].KV.Key != "dying" {
		t.Fatalf("runner event %+v, want DELETE dying", rev2[0])
	}
	if _, err := s.KeepAliveOnce(ctx, l.ID); !errors.Is(err, storage.ErrLeaseNotFound) {
		t.Fatalf("KeepAliveOnce(expired) = %v, want ErrLeaseNotFound", err)
	}
	if got, _ := locks(t, s); len(got) != 0 {
		t.Fatalf("locks after expiry: %v", got)
	}
}

func testWatchNoGaps(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	r0 := acquire(t, s, l, owner("a", "1"), 0, 1)[0]
	snap, err := s.List(ctx, storage.KeyspaceShards)
	if err != nil || len(snap.KVs) != 2 {
		t.Fatalf("List = %v, %v", snap.KVs, err)
	}
	// Writes between the list and the watch must not be lost.
	acquire(t, s, l, owner("a", "1"), 2)
	if _, err := s.Release(ctx, l, []storage.Held{{Shard: 0, Epoch: r0.Epoch}}); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := s.Watch(wctx, storage.KeyspaceShards, snap.Revision+1)
	acquire(t, s, l, owner("a", "1"), 3)
	evs := nextEvents(t, w, 3)
	want := []string{"PUT 2", "DELETE 0", "PUT 3"}
	var got []string
	last := snap.Revision
	for _, e := range evs {
		got = append(got, fmt.Sprintf("%v %s", e.Type, e.KV.Key))
		if e.KV.ModRevision <= last {
			t.Errorf("event %v at revision %d, not after %d", e.Type, e.KV.ModRevision, last)
		}
		last = e.KV.ModRevision
	}
	if !slices.Equal(got, want) {
		t.Fatalf("watch from list revision + 1 = %v, want %v", got, want)
	}
}

// testFollowConcurrent checks that a Follow view equals a final list while
// writers race with the initial list.
func testFollowConcurrent(t *testing.T, in Instance) {
	s := in.Store
	l1, l2 := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	ctx, cancel := context.WithCancel(ctxT(t))
	var (
		mu   sync.Mutex
		view = map[string]storage.Revision{}
		rev  storage.Revision
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = storage.Follow(ctx, s, storage.KeyspaceShards, func(u storage.Update) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case u.Err != nil:
			case u.Reset:
				clear(view)
				for _, kv := range u.KVs {
					view[kv.Key] = kv.ModRevision
				}
				rev = u.Revision
			default:
				for _, e := range u.Events {
					if e.Type == storage.EventPut {
						view[e.KV.Key] = e.KV.ModRevision
					} else {
						delete(view, e.KV.Key)
					}
				}
				rev = u.Revision
			}
		})
	}()
	defer func() { cancel(); <-done }()
	var wg sync.WaitGroup
	for w, l := range []storage.LeaseID{l1, l2} {
		wg.Go(func() {
			for i := range 40 {
				sh := sharding.ShardID(i % 10)
				res, err := s.Acquire(ctx, l, owner(fmt.Sprint(w), "1"), []sharding.ShardID{sh})
				if err != nil {
					t.Errorf("Acquire = %v", err)
					return
				}
				if i%3 == 0 && res[0].Status != storage.HeldElsewhere {
					if _, err := s.Release(ctx, l, []storage.Held{{Shard: sh, Epoch: res[0].Epoch}}); err != nil {
						t.Errorf("Release = %v", err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
	snap, err := s.List(ctx, storage.KeyspaceShards)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]storage.Revision{}
	for _, kv := range snap.KVs {
		want[kv.Key] = kv.ModRevision
	}
	deadline := time.Now().Add(opTimeout)
	for {
		mu.Lock()
		caughtUp := rev >= snap.Revision || equalViews(view, want)
		same := equalViews(view, want)
		got, gotRev := maps.Clone(view), rev
		mu.Unlock()
		if caughtUp {
			if !same {
				// Not under mu: the deferred cancel waits for the follower,
				// whose callback takes mu.
				t.Fatalf("followed view %v at revision %d, want %v at %d", got, gotRev, want, snap.Revision)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("follower did not catch up to revision %d", snap.Revision)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func equalViews(a, b map[string]storage.Revision) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func testCompaction(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	first := acquire(t, s, l, owner("a", "1"), 1)[0].Epoch
	acquire(t, s, l, owner("a", "1"), 2)
	r3 := acquire(t, s, l, owner("a", "1"), 3)[0].Epoch
	if err := in.Compact(ctx, storage.Revision(r3)); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	select {
	case r, ok := <-s.Watch(wctx, storage.KeyspaceShards, storage.Revision(first)):
		if !ok || !errors.Is(r.Err, storage.ErrCompacted) {
			t.Fatalf("Watch from a compacted revision = %+v (open %v), want ErrCompacted", r, ok)
		}
	case <-time.After(opTimeout):
		t.Fatal("Watch from a compacted revision did not fail")
	}
}

func testCheckpoints(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	la, lb := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	if _, ok, err := s.ReadCheckpoint(ctx, 6, ""); err != nil || ok {
		t.Fatalf("ReadCheckpoint(never written) = %v, %v; want not found", ok, err)
	}
	old := acquire(t, s, la, owner("a", "1"), 6)[0].Epoch
	if _, err := s.WriteCheckpoint(ctx, 6, "", old, []byte("v1")); err != nil {
		t.Fatalf("WriteCheckpoint(current epoch) = %v", err)
	}
	// The lock moves to B: A's epoch is dead.
	if _, err := storage.PutHandoff(ctx, s, lb, 6, storage.HandoffRecord{From: "a", To: "b", Phase: storage.HandoffReady}); err != nil {
		t.Fatal(err)
	}
	cur, err := storage.TransferOne(ctx, s, storage.TransferRequest{Shard: 6, FromLease: la, FromEpoch: old, ToLease: lb, ToOwner: owner("b", "1")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.WriteCheckpoint(ctx, 6, "", old, []byte("zombie"))
	var fe *storage.FencedError
	if !errors.As(err, &fe) || !errors.Is(err, storage.ErrFenced) || fe.Current != cur || fe.Epoch != old {
		t.Fatalf("WriteCheckpoint(stale epoch) = %v, want *FencedError{Epoch %d, Current %d}", err, old, cur)
	}
	cp, ok, err := s.ReadCheckpoint(ctx, 6, "")
	if err != nil || !ok || string(cp.Data) != "v1" || cp.Epoch != old {
		t.Fatalf("ReadCheckpoint = %+v, %v, %v; want v1 at epoch %d", cp, ok, err, old)
	}
	if _, err := s.WriteCheckpoint(ctx, 6, "", cur, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	// Unlocked shard: every epoch is stale.
	if _, err := s.Release(ctx, lb, []storage.Held{{Shard: 6, Epoch: cur}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteCheckpoint(ctx, 6, "", cur, []byte("v3")); !errors.As(err, &fe) || fe.Current != 0 {
		t.Fatalf("WriteCheckpoint(released shard) = %v, want *FencedError with Current 0", err)
	}
	if cp, _, _ := s.ReadCheckpoint(ctx, 6, ""); string(cp.Data) != "v2" || cp.Epoch != cur {
		t.Fatalf("ReadCheckpoint = %+v, want v2 at epoch %d", cp, cur)
	}
	// Named checkpoints (one per entity) are independent of each other and
	// of the shard's, and fenced the same way.
	e2 := acquire(t, s, lb, owner("b", "1"), 6)[0].Epoch
	for _, name := range []string{"counter-1", "a/b c?%"} {
		if _, err := s.WriteCheckpoint(ctx, 6, name, e2, []byte("state of "+name)); err != nil {
			t.Fatalf("WriteCheckpoint(%q) = %v", name, err)
		}
		if _, err := s.WriteCheckpoint(ctx, 6, name, cur, []byte("stale")); !errors.Is(err, storage.ErrFenced) {
			t.Fatalf("WriteCheckpoint(%q, stale epoch) = %v, want ErrFenced", name, err)
		}
	}
	for _, name := range []string{"counter-1", "a/b c?%"} {
		cp, ok, err := s.ReadCheckpoint(ctx, 6, name)
		if err != nil || !ok || string(cp.Data) != "state of "+name || cp.Epoch != e2 {
			t.Fatalf("ReadCheckpoint(%q) = %+v, %v, %v", name, cp, ok, err)
		}
	}
	if cp, _, _ := s.ReadCheckpoint(ctx, 6, ""); string(cp.Data) != "v2" {
		t.Fatalf("shard checkpoint overwritten by a named one: %q", cp.Data)
	}
	if _, ok, err := s.ReadCheckpoint(ctx, 6, "never"); err != nil || ok {
		t.Fatalf("ReadCheckpoint(never written) = %v, %v", ok, err)
	}
}

func testCorrupt(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	other, l := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	if err := in.RawPut(ctx, "runners/bad", []byte("{not json"), other); err != nil {
		t.Fatal(err)
	}
	if err := in.RawPut(ctx, "shards/7", []byte("\x00garbage"), other); err != nil {
		t.Fatal(err)
	}
	if err := in.RawPut(ctx, "shards/notanumber", []byte(`{"runnerID":"x"}`), other); err != nil {
		t.Fatal(err)
	}
	snap, err := s.List(ctx, storage.KeyspaceRunners)
	if err != nil || len(snap.KVs) != 1 {
		t.Fatalf("List(runners) = %v, %v", snap.KVs, err)
	}
	var ce *storage.CorruptError
	if _, err := storage.DecodeRunner(snap.KVs[0]); !errors.As(err, &ce) || !errors.Is(err, storage.ErrCorrupt) || ce.Key != "bad" {
		t.Fatalf("DecodeRunner(corrupt) = %v, want *CorruptError for key bad", err)
	}
	// A corrupt lock value is still a lock: held by its lease.
	r := acquire(t, s, l, owner("a", "1"), 7)[0]
	if r.Status != storage.HeldElsewhere || r.Holder.Lease != other {
		t.Fatalf("Acquire(corrupt lock) = %+v, want held elsewhere by lease %x", r, other)
	}
	snap, err = s.List(ctx, storage.KeyspaceShards)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, kv := range snap.KVs {
		lk, err := storage.DecodeLock(kv)
		seen[kv.Key] = true
		switch kv.Key {
		case "7":
			if !errors.As(err, &ce) || lk.Shard != 7 || lk.Lease != other {
				t.Errorf("DecodeLock(7) = %+v, %v; want shard, lease and a *CorruptError", lk, err)
			}
		case "notanumber":
			if !errors.Is(err, storage.ErrCorrupt) {
				t.Errorf("DecodeLock(notanumber) = %v, want ErrCorrupt", err)
			}
		}
	}
	for _, key := range []string{"7", "notanumber"} {
		if !seen[key] {
			t.Errorf("List(shards) omits the corrupt lock %q", key)
		}
	}
	// Keys are canonical: "07" is not shard 7, whatever its value.
	if _, err := storage.DecodeLock(storage.KeyValue{Key: "07", Value: []byte(`{"runnerID":"x","incarnation":"1"}`), Lease: other, ModRevision: 9}); !errors.Is(err, storage.ErrCorrupt) {
		t.Errorf("DecodeLock(07) = %v, want ErrCorrupt", err)
	}
}

// testCorruptCheckpoints: a checkpoint value that decodes as JSON but lacks
// what a writer always stores is corrupt, not an empty state.
func testCorruptCheckpoints(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	for _, bad := range []string{`null`, `{}`, `[]`, `"x"`, `{"epoch":-5,"data":null}`, `{"epoch":0,"data":null}`,
		`{"epoch":5}`, `{"data":"aGk="}`, `{"epoch":"5","data":null}`, `{"epoch":5,"data":"not base64!"}`,
		`{"epoch":5,"epoch":6,"data":null}`, `{"epoch":5,"data":null} {}`, "\xff"} {
		if err := in.RawPut(ctx, "checkpoints/3", []byte(bad), storage.NoLease); err != nil {
			t.Fatal(err)
		}
		cp, ok, err := s.ReadCheckpoint(ctx, 3, "")
		var ce *storage.CorruptError
		if !errors.As(err, &ce) || !errors.Is(err, storage.ErrCorrupt) || ce.Keyspace != "checkpoints" || ce.Key != "3" || ok {
			t.Errorf("ReadCheckpoint(%s) = %+v, %v, %v; want a *CorruptError naming checkpoints/3", bad, cp, ok, err)
		}
	}
	if err := in.RawPut(ctx, "checkpoints/3/c%2F1", []byte(`{}`), storage.NoLease); err != nil {
		t.Fatal(err)
	}
	var ce *storage.CorruptError
	if _, _, err := s.ReadCheckpoint(ctx, 3, "c/1"); !errors.As(err, &ce) || ce.Key != "3/c%2F1" {
		t.Errorf("ReadCheckpoint(3, c/1) of {} = %v, want a *CorruptError naming checkpoints/3/c%%2F1", err)
	}
	if err := in.RawPut(ctx, "checkpoints/3", []byte(`{"epoch":5,"data":"aGk="}`), storage.NoLease); err != nil {
		t.Fatal(err)
	}
	if cp, ok, err := s.ReadCheckpoint(ctx, 3, ""); err != nil || !ok || string(cp.Data) != "hi" || cp.Epoch != 5 {
		t.Errorf("ReadCheckpoint(valid) = %+v, %v, %v; want hi at epoch 5", cp, ok, err)
	}
}

// testRunnerClaims: PutRunner writes only an absent record or one under the
// caller's lease; anything else takes ReplaceRunner at the revision read.
func testRunnerClaims(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	la, lb := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	rec := func(inc, addr string) storage.RunnerRecord {
		return storage.RunnerRecord{ID: "r", Incarnation: inc, Weight: 1, Address: addr}
	}
	if _, err := s.PutRunner(ctx, la, rec("a", "")); err != nil {
		t.Fatalf("PutRunner(absent) = %v", err)
	}
	revA, err := s.PutRunner(ctx, la, rec("a", "127.0.0.1:1"))
	if err != nil {
		t.Fatalf("PutRunner(own lease) = %v", err)
	}
	var ce *storage.RunnerConflictError
	if _, err := s.PutRunner(ctx, lb, rec("b", "")); !errors.As(err, &ce) || ce.Existing.Lease != la || ce.Existing.ModRevision != revA {
		t.Fatalf("PutRunner(other lease) = %v, want a conflict with lease %x at revision %d", err, la, revA)
	}
	if _, err := s.ReplaceRunner(ctx, lb, rec("b", ""), revA-1); !errors.As(err, &ce) || ce.Existing.ModRevision != revA {
		t.Fatalf("ReplaceRunner(stale revision) = %v, want a conflict at revision %d", err, revA)
	}
	revB, err := s.ReplaceRunner(ctx, lb, rec("b", ""), revA)
	if err != nil || revB <= revA {
		t.Fatalf("ReplaceRunner(current revision) = %d, %v", revB, err)
	}
	snap, err := s.List(ctx, storage.KeyspaceRunners)
	if err != nil || len(snap.KVs) != 1 {
		t.Fatalf("List(runners) = %v, %v", snap.KVs, err)
	}
	if r, err := storage.DecodeRunner(snap.KVs[0]); err != nil || r.Incarnation != "b" || r.Lease != lb || r.ModRevision != revB {
		t.Fatalf("runner record = %+v, %v; want incarnation b under lease %x at %d", r, err, lb, revB)
	}
	// A record without a lease is never a live registration, but PutRunner
	// still leaves it alone: the caller decides (ReplaceRunner).
	if err := in.RawPut(ctx, "runners/r", []byte("garbage"), storage.NoLease); err != nil {
		t.Fatal(err)
	}
	_, err = s.PutRunner(ctx, lb, rec("b", ""))
	if !errors.As(err, &ce) || ce.Existing.Lease != storage.NoLease || string(ce.Existing.Value) != "garbage" {
		t.Fatalf("PutRunner(over a lease-less record) = %v, want a conflict showing it", err)
	}
	if _, err := s.ReplaceRunner(ctx, lb, rec("b", ""), ce.Existing.ModRevision); err != nil {
		t.Fatalf("ReplaceRunner(lease-less record) = %v", err)
	}
	if err := in.RawDelete(ctx, "runners/r"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReplaceRunner(ctx, lb, rec("b", ""), revB); !errors.As(err, &ce) || ce.Exists {
		t.Fatalf("ReplaceRunner(absent) = %v, want a conflict with Exists false", err)
	}
}

// testLeaselessLock: a lock without a lease is no ownership: Acquire takes
// it over and says so.
func testLeaselessLock(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	if err := in.RawPut(ctx, "shards/5", []byte("squatter"), storage.NoLease); err != nil {
		t.Fatal(err)
	}
	before, _ := locks2(t, s)
	res := acquire(t, s, l, owner("a", "1"), 5, 6)
	if r := res[0]; r.Status != storage.Acquired || r.Replaced == nil || r.Replaced.Lease != storage.NoLease || r.Replaced.Epoch != before[5] || r.Replaced.Shard != 5 {
		t.Fatalf("Acquire(lease-less 5) = %+v (replaced %+v), want acquired, replacing the lock at epoch %d", r, r.Replaced, before[5])
	}
	if r := res[1]; r.Status != storage.Acquired || r.Replaced != nil {
		t.Fatalf("Acquire(absent 6) = %+v, want acquired replacing nothing", r)
	}
	if got, _ := locks(t, s); got[5].Lease != l || got[5].Epoch != res[0].Epoch {
		t.Fatalf("lock 5 = %+v, want under lease %x at %d", got[5], l, res[0].Epoch)
	}
}

// locks2 lists the lock keys with their revisions, corrupt ones included.
func locks2(t *testing.T, s storage.Store) (map[sharding.ShardID]storage.Epoch, storage.Revision) {
	t.Helper()
	snap, err := s.List(ctxT(t), storage.KeyspaceShards)
	if err != nil {
		t.Fatalf("List(shards) = %v", err)
	}
	out := map[sharding.ShardID]storage.Epoch{}
	for _, kv := range snap.KVs {
		l, _ := storage.DecodeLock(kv)
		out[l.Shard] = l.Epoch
	}
	return out, snap.Revision
}

func testInvalid(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	checks := []struct {
		name string
		err  error
	}{
		{"duplicate shards", func() error { _, err := s.Acquire(ctx, l, owner("a", "1"), []sharding.ShardID{1, 2, 1}); return err }()},
		{"empty owner", func() error { _, err := s.Acquire(ctx, l, storage.Owner{}, []sharding.ShardID{1}); return err }()},
		{"runner without ID", func() error {
			_, err := s.PutRunner(ctx, l, storage.RunnerRecord{Incarnation: "1"})
			return err
		}()},
		{"runner ID with slash", func() error {
			_, err := s.PutRunner(ctx, l, storage.RunnerRecord{ID: "a/b", Incarnation: "1"})
			return err
		}()},
		{"negative weight", func() error {
			_, err := s.PutRunner(ctx, l, storage.RunnerRecord{ID: "a", Incarnation: "1", Weight: -1})
			return err
		}()},
		{"bad handoff phase", func() error {
			_, err := storage.PutHandoff(ctx, s, l, 1, storage.HandoffRecord{From: "a", To: "b", Phase: "bogus"})
			return err
		}()},
		{"zero TTL", func() error { _, err := s.Grant(ctx, 0); return err }()},
		{"runner without lease", func() error {
			_, err := s.PutRunner(ctx, storage.NoLease, storage.RunnerRecord{ID: "a", Incarnation: "1"})
			return err
		}()},
		{"replace runner at revision 0", func() error {
			_, err := s.ReplaceRunner(ctx, l, storage.RunnerRecord{ID: "a", Incarnation: "1"}, 0)
			return err
		}()},
		{"runner weight above MaxWeight", func() error {
			_, err := s.PutRunner(ctx, l, storage.RunnerRecord{ID: "a", Incarnation: "1", Weight: sharding.MaxWeight + 1})
			return err
		}()},
		{"runner address not host:port", func() error {
			_, err := s.PutRunner(ctx, l, storage.RunnerRecord{ID: "a", Incarnation: "1", Address: "nowhere"})
			return err
		}()},
		{"runner ID with a control character", func() error {
			_, err := s.PutRunner(ctx, l, storage.RunnerRecord{ID: "a\x01", Incarnation: "1"})
			return err
		}()},
		// etcd compares a missing key's lease and revision as 0: calls with
		// NoLease or epoch 0 would match absent locks.
		{"acquire without lease", func() error {
			_, err := s.Acquire(ctx, storage.NoLease, owner("a", "1"), []sharding.ShardID{1})
			return err
		}()},
		{"rewrite without lease", func() error {
			_, err := s.Rewrite(ctx, storage.NoLease, owner("a", "1"), []sharding.ShardID{1})
			return err
		}()},
		{"verify without lease", func() error {
			_, err := s.Verify(ctx, storage.NoLease, []storage.Held{{Shard: 1, Epoch: 1}})
			return err
		}()},
		{"verify epoch 0", func() error { _, err := s.Verify(ctx, l, []storage.Held{{Shard: 1}}); return err }()},
		{"release epoch 0", func() error { _, err := s.Release(ctx, l, []storage.Held{{Shard: 1}}); return err }()},
		{"transfer without lease", func() error {
			_, err := storage.TransferOne(ctx, s, storage.TransferRequest{Shard: 1, FromEpoch: 1, ToLease: l, ToOwner: owner("b", "1")})
			return err
		}()},
		{"transfer epoch 0", func() error {
			_, err := storage.TransferOne(ctx, s, storage.TransferRequest{Shard: 1, FromLease: l, ToLease: l, ToOwner: owner("b", "1")})
			return err
		}()},
		{"checkpoint epoch 0", func() error { _, err := s.WriteCheckpoint(ctx, 1, "", 0, []byte("x")); return err }()},
	}
	for _, c := range checks {
		if !errors.Is(c.err, storage.ErrInvalidArgument) {
			t.Errorf("%s: err = %v, want ErrInvalidArgument", c.name, c.err)
		}
	}
	if got, _ := locks(t, s); len(got) != 0 {
		t.Errorf("invalid calls wrote locks: %v", got)
	}
	if _, ok, err := s.ReadCheckpoint(ctx, 1, ""); ok || err != nil {
		t.Errorf("a checkpoint write at epoch 0 left a checkpoint (%v, %v)", ok, err)
	}
}

func testCancelled(t *testing.T, in Instance) {
	s := in.Store
	l := grant(t, s, 30*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Acquire(ctx, l, owner("a", "1"), []sharding.ShardID{1}); !errors.Is(err, storage.ErrUnavailable) {
		t.Errorf("Acquire(cancelled ctx) = %v, want ErrUnavailable", err)
	}
	if _, err := s.KeepAliveOnce(ctx, l); !errors.Is(err, storage.ErrUnavailable) {
		t.Errorf("KeepAliveOnce(cancelled ctx) = %v, want ErrUnavailable", err)
	}
	if _, err := s.List(ctx, storage.KeyspaceShards); !errors.Is(err, storage.ErrUnavailable) {
		t.Errorf("List(cancelled ctx) = %v, want ErrUnavailable", err)
	}
}
