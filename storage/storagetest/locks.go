package storagetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Lock operations: batched acquire, held elsewhere, incarnations, release,
// verify, rewrite.

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
	// Acquired again under the same lease (by another incarnation: the
	// lock keeps the owner that wrote it): already owned, with the lock
	// as found, so that the caller can tell its own write from another's.
	again := acquire(t, s, la, owner("a", "2"), 1, 3)
	if again[0].Status != storage.AlreadyOwned || again[0].Epoch != ra[0].Epoch {
		t.Errorf("Acquire(A, 1) again = %v epoch %d, want already-owned epoch %d", again[0].Status, again[0].Epoch, ra[0].Epoch)
	}
	if want := (storage.Lock{Shard: 1, Owner: owner("a", "1"), Lease: la, Epoch: ra[0].Epoch}); again[0].Holder != want {
		t.Errorf("Acquire(A, 1) again: Holder = %+v, want the lock as found, %+v", again[0].Holder, want)
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

func testLeaseKeys(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l, other := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	res := acquire(t, s, l, owner("a", "1"), shardRange(0, 300)...)
	held := make([]storage.Held, len(res))
	for i, r := range res {
		held[i] = storage.Held{Shard: r.Shard, Epoch: r.Epoch}
	}
	before, _ := locks(t, s)
	if lost, err := storage.VerifyLease(ctx, s, l, held); err != nil || len(lost) != 0 {
		t.Fatalf("VerifyLease(300) = %v, %v; want none lost", lost, err)
	}
	if after, _ := locks(t, s); len(after) != len(before) {
		t.Fatalf("VerifyLease changed the locks: %d -> %d", len(before), len(after))
	}
	// Gone from the lease: one deleted behind our back, one taken by
	// another lease, one released by us. Rewritten under the same lease
	// (a new epoch): still attached, not reported (the documented limit).
	if err := in.RawDelete(ctx, "shards/7"); err != nil {
		t.Fatal(err)
	}
	val, _ := storage.EncodeOwner(owner("thief", "1"))
	if err := in.RawPut(ctx, "shards/150", val, other); err != nil {
		t.Fatal(err)
	}
	if rel, err := s.Release(ctx, l, []storage.Held{held[3]}); err != nil || len(rel) != 1 {
		t.Fatalf("Release(3) = %v, %v", rel, err)
	}
	if rw, err := s.Rewrite(ctx, l, owner("a", "1"), []sharding.ShardID{9}); err != nil || len(rw) != 1 || rw[0].Status != storage.Acquired {
		t.Fatalf("Rewrite(9) = %+v, %v", rw, err)
	}
	lost, err := storage.VerifyLease(ctx, s, l, held)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(lost, func(a, b storage.LostLock) int { return int(a.Shard) - int(b.Shard) })
	if len(lost) != 3 || lost[0].Shard != 3 || lost[1].Shard != 7 || lost[2].Shard != 150 {
		t.Fatalf("VerifyLease after interference = %+v, want shards 3, 7 and 150", lost)
	}
	keys, err := s.LeaseKeys(ctx, l)
	if err != nil || len(keys) != 297 || !slices.Contains(keys, "shards/9") || slices.Contains(keys, "shards/7") {
		t.Fatalf("LeaseKeys = %d keys (shards/9 %v, shards/7 %v), %v; want the 297 locks still attached",
			len(keys), slices.Contains(keys, "shards/9"), slices.Contains(keys, "shards/7"), err)
	}
	// A lease with less than a second left (etcd says TTL 0: seconds
	// rounded down) still has its keys: none is lost.
	short := grant(t, s, 2*time.Second)
	acquire(t, s, short, owner("b", "1"), 400)
	time.Sleep(1100 * time.Millisecond)
	if keys, err := s.LeaseKeys(ctx, short); err != nil || !slices.Equal(keys, []string{"shards/400"}) {
		t.Fatalf("LeaseKeys of a lease with under a second left = %v, %v; want shards/400", keys, err)
	}
	// A lease that ended: every held lock is reported.
	if err := s.Revoke(ctx, l); err != nil {
		t.Fatal(err)
	}
	if lost, err := storage.VerifyLease(ctx, s, l, held[:5]); err != nil || len(lost) != 5 {
		t.Fatalf("VerifyLease of a revoked lease = %v, %v; want all 5 lost", lost, err)
	}
	if keys, err := s.LeaseKeys(ctx, l); !errors.Is(err, storage.ErrLeaseNotFound) {
		t.Fatalf("LeaseKeys of a revoked lease = %v, %v; want ErrLeaseNotFound", keys, err)
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
		if _, err := s.WriteCheckpoint(ctx, r.Shard, "", res[i].Epoch, storage.AnyRevision, []byte("x")); !errors.Is(err, storage.ErrFenced) {
			t.Errorf("checkpoint at the pre-rewrite epoch = %v, want ErrFenced", err)
		}
		if _, err := s.WriteCheckpoint(ctx, r.Shard, "", r.Epoch, storage.AnyRevision, []byte("x")); err != nil {
			t.Errorf("checkpoint at the rewritten epoch = %v", err)
		}
	}
	if out[2].Status != storage.HeldElsewhere || out[2].Holder.Lease != other {
		t.Errorf("Rewrite(3) = %+v, want held elsewhere", out[2])
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
