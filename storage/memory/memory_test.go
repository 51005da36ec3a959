package memory_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/storage/storagetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	storagetest.Run(t, storagetest.Harness{New: func(t *testing.T) storagetest.Instance {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		return storagetest.Instance{
			Store: c.NewStore(t.Name()),
			RawPut: func(_ context.Context, key string, value []byte, lease storage.LeaseID) error {
				_, err := c.Put(key, value, lease)
				return err
			},
			RawRevision: func(_ context.Context, key string) (storage.Revision, bool, error) {
				kv, ok := c.Get(key)
				return kv.ModRevision, ok, nil
			},
			RawDelete: func(_ context.Context, key string) error { c.Delete(key); return nil },
			Compact:   func(_ context.Context, rev storage.Revision) error { c.Compact(rev); return nil },
		}
	}})
}

// ownShard3 returns a new cluster (closed when t ends), a client "a" of
// it, and the epoch at which a holds shard 3's lock.
func ownShard3(t *testing.T) (*memory.Cluster, *memory.Store, storage.Epoch) {
	t.Helper()
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	s := c.NewStore("a")
	ctx := context.Background()
	l, err := s.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Acquire(ctx, l.ID, storage.Owner{RunnerID: "a"}, []sharding.ShardID{3})
	if err != nil || len(res) != 1 || res[0].Status != storage.Acquired {
		t.Fatalf("Acquire = %+v, %v", res, err)
	}
	return c, s, res[0].Epoch
}

// With fencing disabled, a checkpoint under an epoch that is not the
// lock's is accepted; repaired, it is refused again.
func TestDisableFencingAcceptsStaleCheckpoints(t *testing.T) {
	c, s, ep := ownShard3(t)
	ctx := context.Background()
	stale := ep - 1
	if _, err := s.WriteCheckpoint(ctx, 3, "k/e", stale, storage.AnyRevision, []byte("x")); !errors.Is(err, storage.ErrFenced) {
		t.Fatalf("WriteCheckpoint under a stale epoch = %v, want ErrFenced", err)
	}
	c.DisableFencing(true)
	if _, err := s.WriteCheckpoint(ctx, 3, "k/e", stale, storage.AnyRevision, []byte("y")); err != nil {
		t.Fatalf("WriteCheckpoint with fencing disabled = %v", err)
	}
	if cp, ok, err := s.ReadCheckpoint(ctx, 3, "k/e"); err != nil || !ok || string(cp.Data) != "y" {
		t.Fatalf("ReadCheckpoint = %q, %v, %v; want the stale write", cp.Data, ok, err)
	}
	if err := s.DeleteCheckpoint(ctx, 3, "k/e", stale, storage.AnyRevision); err != nil {
		t.Fatalf("DeleteCheckpoint with fencing disabled = %v", err)
	}
	c.DisableFencing(false)
	if _, err := s.WriteCheckpoint(ctx, 3, "k/e", stale, storage.AnyRevision, []byte("z")); !errors.Is(err, storage.ErrFenced) {
		t.Fatalf("WriteCheckpoint under a stale epoch, fencing repaired = %v, want ErrFenced", err)
	}
}

// TestLateStateWriteNeverUndoesALaterOne: a shard state write that failed
// as unavailable and lands later (LateWrites) — a reminder put — after the
// same client's next write of the shard succeeded — its delete — is
// refused (the shard's order key moved), so the reminder stays deleted;
// and the write after a late one that landed first is made again at the
// order key's new revision and succeeds.
func TestLateStateWriteNeverUndoesALaterOne(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, s, ep := ownShard3(t)
		ctx := context.Background()
		rem := storage.Reminder{Shard: 3, Entity: storage.EntityRef{Kind: "k", ID: "e"}, Name: "r", Method: "tick", First: time.Unix(1767323045, 0), Period: time.Second}
		ref := storage.ReminderRef{Entity: rem.Entity, Name: rem.Name}
		write := func(w storage.ShardWrite) error {
			w.Shard, w.Epoch = 3, ep
			_, err := s.WriteShardStates(ctx, []storage.ShardWrite{w})
			return err
		}
		reminders := func() int {
			st, err := s.ReadShardStates(ctx, []sharding.ShardID{3})
			if err != nil {
				t.Fatal(err)
			}
			return len(st[0].Reminders)
		}

		s.LateWrites(memory.OpShardState, time.Second)
		if err := write(storage.ShardWrite{PutReminders: []storage.Reminder{rem}}); !errors.Is(err, storage.ErrUnavailable) {
			t.Fatalf("the late write = %v, want ErrUnavailable", err)
		}
		s.LateWrites(memory.OpShardState, 0)
		if err := write(storage.ShardWrite{DeleteReminders: []storage.ReminderRef{ref}}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second) // the late put is carried out
		synctest.Wait()
		if n := reminders(); n != 0 {
			t.Fatalf("%d reminders after the late put of one that was deleted after it; want 0", n)
		}

		s.LateWrites(memory.OpShardState, time.Second)
		if err := write(storage.ShardWrite{PutReminders: []storage.Reminder{rem}}); !errors.Is(err, storage.ErrUnavailable) {
			t.Fatalf("the late write = %v, want ErrUnavailable", err)
		}
		s.LateWrites(memory.OpShardState, 0)
		time.Sleep(2 * time.Second) // it lands before the next write
		synctest.Wait()
		if n := reminders(); n != 1 {
			t.Fatalf("%d reminders after the late put landed, want 1", n)
		}
		if err := write(storage.ShardWrite{DeleteReminders: []storage.ReminderRef{ref}}); err != nil {
			t.Fatalf("the write after a late one that landed = %v", err)
		}
		if n := reminders(); n != 0 {
			t.Fatalf("%d reminders after the delete, want 0", n)
		}
	})
}
