package storagetest

import (
	"errors"
	"testing"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// Checkpoints, intact and corrupt.

func testCheckpoints(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	la, lb := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	if _, ok, err := s.ReadCheckpoint(ctx, 6, ""); err != nil || ok {
		t.Fatalf("ReadCheckpoint(never written) = %v, %v; want not found", ok, err)
	}
	old := acquire(t, s, la, owner("a", "1"), 6)[0].Epoch
	if _, err := s.WriteCheckpoint(ctx, 6, "", old, storage.AnyRevision, []byte("v1")); err != nil {
		t.Fatalf("WriteCheckpoint(current epoch) = %v", err)
	}
	// The lock moves to B: A's epoch is dead.
	if _, err := storage.PutHandoff(ctx, s, lb, 6, storage.HandoffRecord{From: "a", To: "b", Phase: storage.HandoffReady}); err != nil {
		t.Fatal(err)
	}
	cur, err := storage.TransferOne(ctx, s, storage.TransferRequest{Shard: 6, From: "a", FromLease: la, FromEpoch: old, ToLease: lb, ToOwner: owner("b", "1")})
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.WriteCheckpoint(ctx, 6, "", old, storage.AnyRevision, []byte("zombie"))
	var fe *storage.FencedError
	if !errors.As(err, &fe) || !errors.Is(err, storage.ErrFenced) || fe.Current != cur || fe.Epoch != old {
		t.Fatalf("WriteCheckpoint(stale epoch) = %v, want *FencedError{Epoch %d, Current %d}", err, old, cur)
	}
	cp, ok, err := s.ReadCheckpoint(ctx, 6, "")
	if err != nil || !ok || string(cp.Data) != "v1" || cp.Epoch != old {
		t.Fatalf("ReadCheckpoint = %+v, %v, %v; want v1 at epoch %d", cp, ok, err, old)
	}
	if _, err := s.WriteCheckpoint(ctx, 6, "", cur, storage.AnyRevision, []byte("v2")); err != nil {
		t.Fatal(err)
	}
	// Unlocked shard: every epoch is stale.
	if _, err := s.Release(ctx, lb, []storage.Held{{Shard: 6, Epoch: cur}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.WriteCheckpoint(ctx, 6, "", cur, storage.AnyRevision, []byte("v3")); !errors.As(err, &fe) || fe.Current != 0 {
		t.Fatalf("WriteCheckpoint(released shard) = %v, want *FencedError with Current 0", err)
	}
	if cp, _, _ := s.ReadCheckpoint(ctx, 6, ""); string(cp.Data) != "v2" || cp.Epoch != cur {
		t.Fatalf("ReadCheckpoint = %+v, want v2 at epoch %d", cp, cur)
	}
	// Named checkpoints (one per entity) are independent of each other and
	// of the shard's, and fenced the same way.
	e2 := acquire(t, s, lb, owner("b", "1"), 6)[0].Epoch
	for _, name := range []string{"counter-1", "a/b c?%"} {
		if _, err := s.WriteCheckpoint(ctx, 6, name, e2, storage.AnyRevision, []byte("state of "+name)); err != nil {
			t.Fatalf("WriteCheckpoint(%q) = %v", name, err)
		}
		if _, err := s.WriteCheckpoint(ctx, 6, name, cur, storage.AnyRevision, []byte("stale")); !errors.Is(err, storage.ErrFenced) {
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

// testCheckpointWritesAreOrdered: a checkpoint write or delete names the
// revision it expects the checkpoint at, so a write that reaches the store
// after a later one of the same owner (its outcome unknown to the writer,
// e.g. after a timeout) is refused, not applied over it; the refusal names
// the current revision; the lock's fence is checked first.
func testCheckpointWritesAreOrdered(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l := grant(t, s, 30*time.Second)
	e := acquire(t, s, l, owner("a", "1"), 9)[0].Epoch
	changed := func(what string, err error, prev, cur storage.Revision) {
		t.Helper()
		var ce *storage.CheckpointChangedError
		if !errors.As(err, &ce) || !errors.Is(err, storage.ErrCheckpointChanged) || ce.Shard != 9 || ce.Name != "c/1" || ce.Prev != prev || ce.Current != cur {
			t.Fatalf("%s = %v, want *CheckpointChangedError{Prev %d, Current %d}", what, err, prev, cur)
		}
	}
	holds := func(want string, rev storage.Revision) {
		t.Helper()
		cp, ok, err := s.ReadCheckpoint(ctx, 9, "c/1")
		if err != nil || !ok || string(cp.Data) != want || cp.Revision != rev {
			t.Fatalf("ReadCheckpoint = %q at %d, %v, %v; want %q at %d", cp.Data, cp.Revision, ok, err, want, rev)
		}
	}
	if _, err := s.WriteCheckpoint(ctx, 9, "c/1", e, 7, []byte("v0")); err != nil {
		changed("WriteCheckpoint(none, expected at 7)", err, 7, 0)
	} else {
		t.Fatal("WriteCheckpoint(none, expected at 7) succeeded")
	}
	r1, err := s.WriteCheckpoint(ctx, 9, "c/1", e, 0, []byte("v1"))
	if err != nil {
		t.Fatalf("WriteCheckpoint(none, expected none) = %v", err)
	}
	holds("v1", r1)
	_, err = s.WriteCheckpoint(ctx, 9, "c/1", e, 0, []byte("late"))
	changed("WriteCheckpoint(expected none, at r1)", err, 0, r1)
	holds("v1", r1)
	r2, err := s.WriteCheckpoint(ctx, 9, "c/1", e, r1, []byte("v2"))
	if err != nil || r2 <= r1 {
		t.Fatalf("WriteCheckpoint(expected r1) = %d, %v; want a revision after %d", r2, err, r1)
	}
	// The write that expected r1 and lost the race: it never lands over v2.
	_, err = s.WriteCheckpoint(ctx, 9, "c/1", e, r1, []byte("v1'"))
	changed("WriteCheckpoint(expected r1, at r2)", err, r1, r2)
	holds("v2", r2)
	changed("DeleteCheckpoint(expected r1, at r2)", s.DeleteCheckpoint(ctx, 9, "c/1", e, r1), r1, r2)
	holds("v2", r2)
	// The lock's fence first: a stale epoch is fenced whatever the revision.
	e2 := rewrite(t, s, l, 9)
	if _, err := s.WriteCheckpoint(ctx, 9, "c/1", e, r2, []byte("zombie")); !errors.Is(err, storage.ErrFenced) {
		t.Fatalf("WriteCheckpoint(stale epoch, right revision) = %v, want ErrFenced", err)
	}
	if _, err := s.WriteCheckpoint(ctx, 9, "c/1", e, r1, []byte("zombie")); !errors.Is(err, storage.ErrFenced) {
		t.Fatalf("WriteCheckpoint(stale epoch, wrong revision) = %v, want ErrFenced", err)
	}
	if err := s.DeleteCheckpoint(ctx, 9, "c/1", e2, r2); err != nil {
		t.Fatalf("DeleteCheckpoint(expected r2) = %v", err)
	}
	if _, ok, err := s.ReadCheckpoint(ctx, 9, "c/1"); err != nil || ok {
		t.Fatalf("ReadCheckpoint(deleted) = %v, %v", ok, err)
	}
	if err := s.DeleteCheckpoint(ctx, 9, "c/1", e2, 0); err != nil {
		t.Fatalf("DeleteCheckpoint(none, expected none) = %v", err)
	}
	changed("DeleteCheckpoint(none, expected r2)", s.DeleteCheckpoint(ctx, 9, "c/1", e2, r2), r2, 0)
	// AnyRevision: unconditional (tools).
	if _, err := s.WriteCheckpoint(ctx, 9, "c/1", e2, storage.AnyRevision, []byte("v3")); err != nil {
		t.Fatalf("WriteCheckpoint(AnyRevision) = %v", err)
	}
	if err := s.DeleteCheckpoint(ctx, 9, "c/1", e2, storage.AnyRevision); err != nil {
		t.Fatalf("DeleteCheckpoint(AnyRevision) = %v", err)
	}
}
