package storagetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Damaged values and bad arguments: typed errors, nothing changed.

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
		{"runner debug URL not http(s)", func() error {
			_, err := s.PutRunner(ctx, l, storage.RunnerRecord{ID: "a", Incarnation: "1", DebugURL: "ftp://host/debug"})
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
			_, err := storage.TransferOne(ctx, s, storage.TransferRequest{Shard: 1, From: "a", FromEpoch: 1, ToLease: l, ToOwner: owner("b", "1")})
			return err
		}()},
		{"transfer epoch 0", func() error {
			_, err := storage.TransferOne(ctx, s, storage.TransferRequest{Shard: 1, From: "a", FromLease: l, ToLease: l, ToOwner: owner("b", "1")})
			return err
		}()},
		{"transfer without its old owner", func() error {
			_, err := storage.TransferOne(ctx, s, storage.TransferRequest{Shard: 1, FromLease: l, FromEpoch: 1, ToLease: l, ToOwner: owner("b", "1")})
			return err
		}()},
		{"release telling an invalid runner", func() error {
			_, err := s.Release(ctx, l, []storage.Held{{Shard: 1, Epoch: 1, Tell: "a/b"}})
			return err
		}()},
		{"delete a handoff record of no old owner", func() error {
			_, err := s.DeleteHandoffs(ctx, l, []storage.HandoffRef{{Shard: 1}})
			return err
		}()},
		{"delete notices of an invalid runner", func() error {
			_, err := s.DeleteNotices(ctx, "", []storage.NoticeSeen{{Shard: 1, Revision: 1}})
			return err
		}()},
		{"checkpoint epoch 0", func() error { _, err := s.WriteCheckpoint(ctx, 1, "", 0, storage.AnyRevision, []byte("x")); return err }()},
		{"checkpoint revision -2", func() error { _, err := s.WriteCheckpoint(ctx, 1, "", 1, -2, []byte("x")); return err }()},
		{"checkpoint delete revision -2", s.DeleteCheckpoint(ctx, 1, "", 1, -2)},
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
