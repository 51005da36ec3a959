package storagetest

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Transfers and handoff records.

func testTransfer(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	la, lb := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	r := acquire(t, s, la, owner("a", "1"), 4)[0]
	req := storage.TransferRequest{Shard: 4, From: "a", FromLease: la, FromEpoch: r.Epoch, ToLease: lb, ToOwner: owner("b", "1")}
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
	// The new owner's notice, written in the same transaction: its
	// revision is the new epoch, under the new owner's lease.
	notes := notices(t, s, "b")
	if n, ok := notes[4]; len(notes) != 1 || !ok || n.Kind != storage.NoticeMoved || n.From != "a" || n.Incarnation != "1" ||
		storage.Epoch(n.ModRevision) != epoch || n.Lease != lb {
		t.Fatalf("notices to b after the transfer = %+v, want a moved notice of shard 4 at epoch %d under lease %x", notes, epoch, lb)
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
		reqs[i] = storage.TransferRequest{Shard: sharding.ShardID(i), From: "a", FromLease: la, FromEpoch: res[i].Epoch, ToLease: lb, ToOwner: owner("b", "1")}
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
	if notes := notices(t, s, "b"); len(notes) != moved {
		t.Errorf("%d notices to b, want one per moved shard (%d)", len(notes), moved)
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
	snap, err := s.List(ctx, storage.HandoffsFrom("a"))
	if err != nil || len(snap.KVs) != n {
		t.Fatalf("List(handoffs/a) = %d keys, %v; want %d", len(snap.KVs), err, n)
	}
	for _, kv := range snap.KVs {
		h, err := storage.DecodeHandoff("a", kv)
		if err != nil || (h.Shard == 42) != (h.Lease == lc) || (h.Shard != 42 && h.Phase != storage.HandoffReady) {
			t.Errorf("record %+v, %v", h, err)
		}
	}
	refs := make([]storage.HandoffRef, n)
	for i := range refs {
		refs[i] = storage.HandoffRef{Shard: sharding.ShardID(i), From: "a"}
	}
	deleted, err := s.DeleteHandoffs(ctx, lb, refs)
	if err != nil || len(deleted) != n-1 || slices.Contains(deleted, 42) {
		t.Fatalf("DeleteHandoffs = %d deleted (42 among them: %v), %v; want %d, not c's", len(deleted), slices.Contains(deleted, 42), err, n-1)
	}
	if snap, err := s.List(ctx, storage.HandoffsFrom("a")); err != nil || len(snap.KVs) != 1 {
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
	// Keyed by the old owner: what another old owner watches holds none.
	if snap, err := s.List(ctx, storage.HandoffsFrom("x")); err != nil || len(snap.KVs) != 0 {
		t.Fatalf("List(handoffs/x) = %v, %v; want none", snap.KVs, err)
	}
	snap, err := s.List(ctx, storage.HandoffsFrom("a"))
	if err != nil || len(snap.KVs) != 1 {
		t.Fatalf("List(handoffs/a) = %v, %v", snap.KVs, err)
	}
	h, err := storage.DecodeHandoff("a", snap.KVs[0])
	if err != nil || h.HandoffRecord != rec || h.Shard != 9 || h.Lease != lb {
		t.Fatalf("handoff = %+v, %v; want %+v under lease %x", h, err, rec, lb)
	}
	if ok, err := storage.DeleteHandoff(ctx, s, lc, storage.HandoffRef{Shard: 9, From: "a"}); err != nil || ok {
		t.Fatalf("DeleteHandoff by another lease = %v, %v; want false", ok, err)
	}
	if ok, err := storage.DeleteHandoff(ctx, s, lb, storage.HandoffRef{Shard: 9, From: "x"}); err != nil || ok {
		t.Fatalf("DeleteHandoff under another old owner = %v, %v; want false", ok, err)
	}
	if ok, err := storage.DeleteHandoff(ctx, s, lb, storage.HandoffRef{Shard: 9, From: "a"}); err != nil || !ok {
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

// notices returns the notices to runner to, by shard.
func notices(t *testing.T, s storage.Store, to string) map[sharding.ShardID]storage.Notice {
	t.Helper()
	ks := storage.NoticesTo(to)
	snap, err := s.List(ctxT(t), ks)
	if err != nil {
		t.Fatalf("List(%s): %v", ks, err)
	}
	out := make(map[sharding.ShardID]storage.Notice, len(snap.KVs))
	for _, kv := range snap.KVs {
		n, err := storage.DecodeNotice(ks, kv)
		if err != nil {
			t.Fatalf("notice %s: %v", kv.Key, err)
		}
		out[n.Shard] = n
	}
	return out
}

// testNotices: a release that names the runner to tell writes a released
// notice under the releasing lease in the same transaction; DeleteNotices
// deletes a notice only at the revision its runner applied; a notice
// vanishes with its lease.
func testNotices(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	la := grant(t, s, 30*time.Second)
	res := acquire(t, s, la, owner("a", "1"), 1, 2, 3)
	held := []storage.Held{{Shard: 1, Epoch: res[0].Epoch, Tell: "b"}, {Shard: 2, Epoch: res[1].Epoch}, {Shard: 3, Epoch: res[2].Epoch - 1, Tell: "b"}}
	rel, err := s.Release(ctx, la, held)
	if err != nil || len(rel) != 2 {
		t.Fatalf("Release = %v, %v; want shards 1 and 2", rel, err)
	}
	notes := notices(t, s, "b")
	n, ok := notes[1]
	if len(notes) != 1 || !ok || n.Kind != storage.NoticeReleased || n.Lease != la {
		t.Fatalf("notices to b = %+v, want one released notice of shard 1 (shard 3 was not released) under lease %x", notes, la)
	}
	// Deleted only at the revision applied.
	if d, err := s.DeleteNotices(ctx, "b", []storage.NoticeSeen{{Shard: 1, Revision: n.ModRevision - 1}}); err != nil || d != 0 {
		t.Fatalf("DeleteNotices at an older revision = %d, %v; want 0", d, err)
	}
	if d, err := s.DeleteNotices(ctx, "b", []storage.NoticeSeen{{Shard: 1, Revision: n.ModRevision}, {Shard: 9, Revision: 1}}); err != nil || d != 1 {
		t.Fatalf("DeleteNotices = %d, %v; want 1", d, err)
	}
	if notes := notices(t, s, "b"); len(notes) != 0 {
		t.Fatalf("notices to b after DeleteNotices = %+v", notes)
	}
	// A released notice vanishes with the releasing lease.
	r4 := acquire(t, s, la, owner("a", "1"), 4)[0]
	if _, err := s.Release(ctx, la, []storage.Held{{Shard: 4, Epoch: r4.Epoch, Tell: "c"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Revoke(ctx, la); err != nil {
		t.Fatal(err)
	}
	if notes := notices(t, s, "c"); len(notes) != 0 {
		t.Fatalf("notices to c after the releasing lease ended = %+v, want none", notes)
	}
	if _, err := s.DeleteNotices(ctx, "b", []storage.NoticeSeen{{Shard: 1, Revision: 0}}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Errorf("DeleteNotices at revision 0 = %v, want ErrInvalidArgument", err)
	}
}
