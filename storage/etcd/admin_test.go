package etcd_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// TestOperatorCalls: UpdateRunner writes only over the record read (and
// keeps its lease), LeaseTimeToLive follows the lease, Namespaces finds
// the namespaces holding shardhost keys.
func TestOperatorCalls(t *testing.T) {
	srv := testenv.StartEtcd(t)
	cli := srv.Client(t)
	ctx := t.Context()
	s, err := etcd.New(cli, "ops", etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	l, err := s.Grant(ctx, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rec := storage.RunnerRecord{ID: "r1", Address: "127.0.0.1:1", Weight: 2, Incarnation: "i1", Started: time.Unix(1, 0).UTC()}
	if _, err := s.PutRunner(ctx, l.ID, rec); err != nil {
		t.Fatal(err)
	}
	snap, err := s.List(ctx, storage.KeyspaceRunners)
	if err != nil || len(snap.KVs) != 1 {
		t.Fatalf("List = %v, %v", snap, err)
	}
	read := snap.KVs[0]

	drained := rec
	drained.Draining = true
	rev, err := s.UpdateRunner(ctx, drained, read.ModRevision)
	if err != nil {
		t.Fatalf("UpdateRunner at the read revision: %v", err)
	}
	snap, _ = s.List(ctx, storage.KeyspaceRunners)
	got, err := storage.DecodeRunner(snap.KVs[0])
	if err != nil || !got.Draining || got.Weight != 2 || got.Lease != l.ID || got.ModRevision != rev {
		t.Errorf("after UpdateRunner: %+v (%v), want draining, weight 2, lease %x, revision %d", got, err, l.ID, rev)
	}
	// A stale revision writes nothing.
	if _, err := s.UpdateRunner(ctx, rec, read.ModRevision); !errors.Is(err, storage.ErrConflict) {
		t.Errorf("UpdateRunner at a stale revision: %v, want ErrConflict", err)
	}
	if _, err := s.UpdateRunner(ctx, storage.RunnerRecord{ID: "nobody", Incarnation: "x"}, 1); !errors.Is(err, storage.ErrConflict) {
		t.Errorf("UpdateRunner of a missing record: %v, want ErrConflict", err)
	}
	if snap, _ := s.List(ctx, storage.KeyspaceRunners); len(snap.KVs) != 1 || snap.KVs[0].ModRevision != rev {
		t.Errorf("a refused update wrote: %+v", snap.KVs)
	}

	if ttl, err := s.LeaseTimeToLive(ctx, l.ID); err != nil || ttl <= 0 || ttl > 30*time.Second {
		t.Errorf("LeaseTimeToLive = %v, %v; want in (0, 30s]", ttl, err)
	}
	if rev, err := s.Revision(ctx); err != nil || rev < got.ModRevision {
		t.Errorf("Revision = %d, %v; want >= %d", rev, err, got.ModRevision)
	}
	if err := s.Revoke(ctx, l.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.LeaseTimeToLive(ctx, l.ID); !errors.Is(err, storage.ErrLeaseNotFound) {
		t.Errorf("LeaseTimeToLive after Revoke: %v, want ErrLeaseNotFound", err)
	}

	other, _ := etcd.New(cli, "other", etcd.Config{})
	l2, _ := other.Grant(ctx, 30*time.Second)
	if _, err := other.PutHandoff(ctx, l2.ID, 3, storage.HandoffRecord{From: "a", To: "b", Phase: storage.HandoffWarming}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/unrelated/key", "x"); err != nil {
		t.Fatal(err)
	}
	if ns, err := etcd.Namespaces(ctx, cli, 0); err != nil || !slices.Equal(ns, []string{"other"}) {
		t.Errorf("Namespaces = %v, %v; want [other] (ops is empty after the revoke; /unrelated holds no shardhost key)", ns, err)
	}
}
