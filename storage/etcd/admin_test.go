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

// TestOperatorCalls: RequestDrain and CancelDrain write and delete
// lease-less drain requests, LeaseTimeToLive follows the lease, Namespaces
// finds the namespaces holding shardhost keys (a drain request counts).
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

	// Drain requests: lease-less keys, listed like the other keyspaces.
	if _, err := s.RequestDrain(ctx, "r1", storage.DrainRequest{Requested: time.Unix(2, 0).UTC(), By: "test"}); err != nil {
		t.Fatal(err)
	}
	drains, err := s.List(ctx, storage.KeyspaceDrains)
	if err != nil || len(drains.KVs) != 1 || drains.KVs[0].Lease != storage.NoLease {
		t.Fatalf("drains after RequestDrain = %+v, %v; want one lease-less key", drains.KVs, err)
	}
	if id, req, err := storage.DecodeDrain(drains.KVs[0]); err != nil || id != "r1" || req.By != "test" {
		t.Errorf("drain request = %q %+v %v", id, req, err)
	}
	if _, err := s.RequestDrain(ctx, "a/b", storage.DrainRequest{}); !errors.Is(err, storage.ErrInvalidArgument) {
		t.Errorf("RequestDrain of a bad ID: %v", err)
	}
	if ok, err := s.CancelDrain(ctx, "r1"); !ok || err != nil {
		t.Errorf("CancelDrain = %v, %v; want true", ok, err)
	}
	if ok, err := s.CancelDrain(ctx, "r1"); ok || err != nil {
		t.Errorf("second CancelDrain = %v, %v; want false", ok, err)
	}
	got, err := storage.DecodeRunner(read)
	if err != nil {
		t.Fatal(err)
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
	if _, err := other.RequestDrain(ctx, "x", storage.DrainRequest{Requested: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/unrelated/key", "x"); err != nil {
		t.Fatal(err)
	}
	if ns, err := etcd.Namespaces(ctx, cli, 0); err != nil || !slices.Equal(ns, []string{"other"}) {
		t.Errorf("Namespaces = %v, %v; want [other] (ops is empty after the revoke and the cancel; /unrelated holds no shardhost key)", ns, err)
	}
}
