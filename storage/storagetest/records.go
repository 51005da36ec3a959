package storagetest

import (
	"errors"
	"testing"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// testClusterRecord: the cluster record is created once (rev 0: only if
// absent) and changed only at the revision the writer read.
func testClusterRecord(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	if info, ok, err := s.ReadCluster(ctx); err != nil || ok {
		t.Fatalf("ReadCluster(never written) = %+v, %v, %v; want not found", info, ok, err)
	}
	first := storage.ClusterRecord{NumShards: 64, WrittenBy: "gw"}
	rev, err := s.WriteCluster(ctx, first, 0)
	if err != nil || rev <= 0 {
		t.Fatalf("WriteCluster(absent) = %d, %v", rev, err)
	}
	info, ok, err := s.ReadCluster(ctx)
	if err != nil || !ok || info.ClusterRecord != first || info.ModRevision != rev {
		t.Fatalf("ReadCluster = %+v, %v, %v; want %+v at %d", info, ok, err, first, rev)
	}
	// A second creator loses and is shown the record.
	_, err = s.WriteCluster(ctx, storage.ClusterRecord{NumShards: 128}, 0)
	var ce *storage.ClusterConflictError
	if !errors.As(err, &ce) || !errors.Is(err, storage.ErrClusterConflict) || !ce.Exists || ce.Existing.ModRevision != rev {
		t.Fatalf("WriteCluster(create over an existing record) = %v, want *ClusterConflictError showing revision %d", err, rev)
	}
	if got, err := storage.DecodeCluster(ce.Existing); err != nil || got.ClusterRecord != first {
		t.Fatalf("DecodeCluster(conflict) = %+v, %v; want %+v", got, err, first)
	}
	// An update at the revision read succeeds; at an older one it fails.
	second := storage.ClusterRecord{NumShards: 64, Strategy: "balanced", WrittenBy: "r1", Layout: storage.Layout}
	rev2, err := s.WriteCluster(ctx, second, rev)
	if err != nil || rev2 <= rev {
		t.Fatalf("WriteCluster(at %d) = %d, %v", rev, rev2, err)
	}
	if _, err := s.WriteCluster(ctx, storage.ClusterRecord{NumShards: 8}, rev); !errors.As(err, &ce) || ce.Existing.ModRevision != rev2 {
		t.Fatalf("WriteCluster(at a stale revision) = %v, want a conflict showing %d", err, rev2)
	}
	if info, _, _ := s.ReadCluster(ctx); info.ClusterRecord != second {
		t.Fatalf("ReadCluster = %+v, want %+v", info, second)
	}
	// An update of an absent record is a conflict too.
	if err := in.RawDelete(ctx, storage.ClusterKey); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteCluster(ctx, second, rev2); !errors.As(err, &ce) || ce.Exists {
		t.Fatalf("WriteCluster(at %d, deleted) = %v, want a conflict with Exists false", rev2, err)
	}
	for _, bad := range []storage.ClusterRecord{{NumShards: 0}, {NumShards: 1 << 30}, {NumShards: 8, Strategy: "a/b"}} {
		if _, err := s.WriteCluster(ctx, bad, 0); !errors.Is(err, storage.ErrInvalidArgument) {
			t.Errorf("WriteCluster(%+v) = %v, want ErrInvalidArgument", bad, err)
		}
	}
	// Damaged: the revision comes with the error, to replace it there.
	for _, v := range []string{`{}`, `null`, `{"numShards":"64"}`, `{"numShards":0}`, "\xff"} {
		if err := in.RawPut(ctx, storage.ClusterKey, []byte(v), storage.NoLease); err != nil {
			t.Fatal(err)
		}
		info, ok, err := s.ReadCluster(ctx)
		var cor *storage.CorruptError
		if !errors.As(err, &cor) || cor.Key != storage.ClusterKey || !ok || info.ModRevision <= 0 {
			t.Fatalf("ReadCluster(%s) = %+v, %v, %v; want a *CorruptError naming %s with the revision", v, info, ok, err, storage.ClusterKey)
		}
		if _, err := s.WriteCluster(ctx, second, info.ModRevision); err != nil {
			t.Fatalf("WriteCluster(replacing the damaged record at %d) = %v", info.ModRevision, err)
		}
	}
	// The record is no member of any keyspace.
	for _, ks := range []storage.Keyspace{storage.KeyspaceRunners, storage.KeyspaceShards, storage.KeyspaceHandoffs} {
		if snap, err := s.List(ctx, ks); err != nil || len(snap.KVs) != 0 {
			t.Errorf("List(%s) = %v, %v; want nothing", ks, snap.KVs, err)
		}
	}
}

// testDeleteCheckpoint: deleting a checkpoint is fenced like writing one.
func testDeleteCheckpoint(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	la := grant(t, s, 30*time.Second)
	e1 := acquire(t, s, la, owner("a", "1"), 4)[0].Epoch
	for _, name := range []string{"", "cart/42"} {
		if _, err := s.WriteCheckpoint(ctx, 4, name, e1, storage.AnyRevision, []byte("state")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteCheckpoint(ctx, 4, "cart/42", e1, storage.AnyRevision); err != nil {
		t.Fatalf("DeleteCheckpoint(current epoch) = %v", err)
	}
	if _, ok, err := s.ReadCheckpoint(ctx, 4, "cart/42"); err != nil || ok {
		t.Fatalf("ReadCheckpoint(deleted) = %v, %v; want not found", ok, err)
	}
	if _, ok, _ := s.ReadCheckpoint(ctx, 4, ""); !ok {
		t.Fatal("deleting a named checkpoint deleted the shard's")
	}
	if err := s.DeleteCheckpoint(ctx, 4, "never-written", e1, storage.AnyRevision); err != nil {
		t.Fatalf("DeleteCheckpoint(absent) = %v, want nil", err)
	}
	// A new epoch fences the old one out.
	e2 := rewrite(t, s, la, 4)
	var fe *storage.FencedError
	if err := s.DeleteCheckpoint(ctx, 4, "", e1, storage.AnyRevision); !errors.As(err, &fe) || fe.Epoch != e1 || fe.Current != e2 {
		t.Fatalf("DeleteCheckpoint(stale epoch) = %v, want *FencedError{Epoch %d, Current %d}", err, e1, e2)
	}
	if _, ok, _ := s.ReadCheckpoint(ctx, 4, ""); !ok {
		t.Fatal("a fenced delete deleted the checkpoint")
	}
	if _, err := s.Release(ctx, la, []storage.Held{{Shard: 4, Epoch: e2}}); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteCheckpoint(ctx, 4, "", e2, storage.AnyRevision); !errors.As(err, &fe) || fe.Current != 0 {
		t.Fatalf("DeleteCheckpoint(released shard) = %v, want *FencedError with Current 0", err)
	}
	if err := s.DeleteCheckpoint(ctx, 4, "", 0, storage.AnyRevision); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Fatalf("DeleteCheckpoint(epoch 0) = %v, want ErrInvalidArgument", err)
	}
}

// rewrite bumps the epoch of a lock held under lease and returns it.
func rewrite(t *testing.T, s storage.Store, lease storage.LeaseID, shard int) storage.Epoch {
	t.Helper()
	res, err := s.Rewrite(ctxT(t), lease, owner("a", "1"), shardRange(shard, shard+1))
	if err != nil || len(res) != 1 || res[0].Status != storage.Acquired {
		t.Fatalf("Rewrite(%d) = %+v, %v", shard, res, err)
	}
	return res[0].Epoch
}
