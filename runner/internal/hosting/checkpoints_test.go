package hosting

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// lateStore is a store whose next checkpoint write, once hold is set,
// fails at once with ErrUnavailable yet is applied later, when the test
// calls the function it sent on held: an etcd request whose client timed
// out and that the server applied after a newer one (bench/faults saw one
// such write, left in flight by a timeout, undo a later checkpoint).
type lateStore struct {
	*memory.Store
	hold atomic.Bool
	held chan func() error
}

func (s *lateStore) WriteCheckpoint(ctx context.Context, shard sharding.ShardID, name string, epoch storage.Epoch, prev storage.Revision, data []byte) (storage.Revision, error) {
	if s.hold.CompareAndSwap(true, false) {
		s.held <- func() error {
			_, err := s.Store.WriteCheckpoint(context.Background(), shard, name, epoch, prev, data)
			return err
		}
		return 0, fmt.Errorf("write checkpoint of shard %d: %w", shard, storage.ErrUnavailable)
	}
	return s.Store.WriteCheckpoint(ctx, shard, name, epoch, prev, data)
}

// saver checkpoints the value each put gives it, with the Checkpoint kept
// from Activate.
type saver struct {
	cp func(context.Context, []byte) error
}

func (s *saver) Activate(ctx context.Context, info entity.ActivateInfo) error {
	s.cp = info.Checkpoint
	_, _, err := info.Restore(ctx)
	return err
}

var (
	saverKind = entity.NewKind("saver", func(string) *saver { return &saver{} })
	saverPut  = entity.Method(saverKind, "put", func(s *saver, ctx context.Context, v string) (string, error) {
		return v, s.cp(ctx, []byte(v))
	})
)

// TestLateCheckpointWriteNeverOverwritesALaterOne: an entity's checkpoint
// write whose outcome its writer could not know (it failed as
// unavailable) is applied by the store after the entity's next write
// succeeded: the store refuses it, the later state stays. And when the
// unknown write lands before the next one, the next one is still stored
// (refused once at the revision it expected, written again at the
// current one).
func TestLateCheckpointWriteNeverOverwritesALaterOne(t *testing.T) {
	mem := memory.NewCluster()
	t.Cleanup(mem.Close)
	mem.DisableFencing(true) // the shard's lock is not what this test is about
	store := &lateStore{Store: mem.NewStore("r1"), held: make(chan func() error, 1)}
	host := New(Config{RunnerID: "r1", NumShards: 4, DrainTimeout: 5 * time.Second, CutoverWaiters: 4, PassivationInterval: time.Hour},
		&testEnv{}, store, testMetrics(t), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := host.Register(saverKind); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	t.Cleanup(func() { cancel(ErrShutdown) })
	sh := host.NewShard(ShardSpec{ID: 1, Epoch: 7, Ctx: ctx, Attachment: context.Background(), Reason: entity.ActivateNew})
	host.Install(sh)
	kind := host.Kind("saver")
	put := func(v string) error {
		t.Helper()
		h, _ := kind.Desc.Handler("put")
		return sh.Deliver(context.Background(), kind, h, "e", v, false, false, false).Err
	}
	stored := func() string {
		t.Helper()
		cp, _, err := store.ReadCheckpoint(context.Background(), 1, "saver/e")
		if err != nil {
			t.Fatal(err)
		}
		return string(cp.Data)
	}

	if err := put("1"); err != nil {
		t.Fatal(err)
	}
	store.hold.Store(true)
	if err := put("2"); err == nil {
		t.Fatal("the held write reported success")
	}
	if err := put("3"); err != nil {
		t.Fatalf("the write after an unknown one = %v", err)
	}
	if err := (<-store.held)(); err == nil {
		t.Error("the write of 2, applied after the write of 3, was accepted")
	}
	if got := stored(); got != "3" {
		t.Fatalf("stored checkpoint = %q after a late write of 2; want the later 3", got)
	}

	store.hold.Store(true)
	if err := put("4"); err == nil {
		t.Fatal("the held write reported success")
	}
	if err := (<-store.held)(); err != nil {
		t.Fatalf("the write of 4, applied before any other: %v", err)
	}
	if err := put("5"); err != nil {
		t.Fatalf("the write after an unknown one that landed = %v", err)
	}
	if got := stored(); got != "5" {
		t.Fatalf("stored checkpoint = %q, want 5", got)
	}
}
