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
