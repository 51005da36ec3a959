package registration

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

func TestEveryRunnerOfAClusterAgreesOnItsSettings(t *testing.T) {
	ctx := context.Background()
	s := memory.New()
	client := storage.ClusterRecord{NumShards: 64, WrittenBy: "client", Layout: storage.Layout} // a client-only runner publishes no strategy
	if got, err := CheckCluster(ctx, s, client, quiet); err != nil || got.Strategy != "" {
		t.Fatalf("first runner: %+v, %v, want the record published (no strategy)", got, err)
	}
	host := storage.ClusterRecord{NumShards: 64, Strategy: "rendezvous", WrittenBy: "a", Layout: storage.Layout}
	if got, err := CheckCluster(ctx, s, host, quiet); err != nil || got.Strategy != "rendezvous" {
		t.Fatalf("hosting runner after a client-only one: %+v, %v, want its strategy added", got, err)
	}
	if got, err := CheckCluster(ctx, s, client, quiet); err != nil || got.Strategy != "rendezvous" || got.WrittenBy != "a" {
		t.Fatalf("client-only runner after a hosting one: %+v, %v, want the record the hosting runner wrote (its strategy)", got, err)
	}
	if info, ok, err := s.ReadCluster(ctx); err != nil || !ok || info.Strategy != "rendezvous" {
		t.Fatalf("cluster record = %+v, %v, %v; want the strategy added", info, ok, err)
	}
	var mm *ClusterMismatchError
	for _, c := range []struct {
		rec     storage.ClusterRecord
		setting string
	}{
		{storage.ClusterRecord{NumShards: 128, WrittenBy: "b", Layout: storage.Layout}, "NumShards"},
		{storage.ClusterRecord{NumShards: 64, Strategy: "other", WrittenBy: "b", Layout: storage.Layout}, "Strategy"},
		{storage.ClusterRecord{NumShards: 64, Strategy: "rendezvous", WrittenBy: "b", Layout: storage.Layout + 1}, "coordination layout"},
	} {
		_, err := CheckCluster(ctx, s, c.rec, quiet)
		if !errors.As(err, &mm) || mm.Setting != c.setting || !errors.Is(err, ErrClusterMismatch) {
			t.Errorf("runner with %+v: %v, want a *ClusterMismatchError on %s", c.rec, err, c.setting)
		}
	}
}

// TestRunnersOfAnotherLayoutRefuseToShareACluster: a cluster whose record
// was published by an older version (no layout member: layout 1) is
// refused by a runner of this layout, hosting or client-only, with an
// error naming both layouts; and a record of this layout carries it in its
// strategy member, which an older runner compares with its own strategy
// (so it refuses too, naming both).
func TestRunnersOfAnotherLayoutRefuseToShareACluster(t *testing.T) {
	ctx := context.Background()
	s := memory.New()
	if _, err := s.Cluster().Put(storage.ClusterKey, []byte(`{"numShards":64,"strategy":"balanced","writtenBy":"old"}`), storage.NoLease); err != nil {
		t.Fatal(err)
	}
	for _, want := range []storage.ClusterRecord{
		{NumShards: 64, Strategy: "balanced", WrittenBy: "new", Layout: storage.Layout},
		{NumShards: 64, WrittenBy: "gateway", Layout: storage.Layout},
	} {
		_, err := CheckCluster(ctx, s, want, quiet)
		var mm *ClusterMismatchError
		if !errors.As(err, &mm) || mm.Setting != "coordination layout" || !strings.Contains(err.Error(), "layout 1") || !strings.Contains(err.Error(), "layout 2") {
			t.Errorf("runner %+v in a layout-1 cluster: %v, want a *ClusterMismatchError naming layouts 1 and 2", want, err)
		}
	}
	// A record published by this layout, as an older runner reads it: its
	// strategy member is not the plain strategy name.
	s2 := memory.New()
	if _, err := CheckCluster(ctx, s2, storage.ClusterRecord{NumShards: 64, Strategy: "balanced", WrittenBy: "new", Layout: storage.Layout}, quiet); err != nil {
		t.Fatal(err)
	}
	kv, ok := s2.Cluster().Get(storage.ClusterKey)
	if !ok || !strings.Contains(string(kv.Value), `"strategy":"balanced (layout 2)"`) || !strings.Contains(string(kv.Value), `"layout":2`) {
		t.Errorf("stored record %q, want its strategy member to carry layout 2", kv.Value)
	}
}

func TestADamagedClusterRecordIsReplaced(t *testing.T) {
	ctx := context.Background()
	s := memory.New()
	if _, err := s.Cluster().Put(storage.ClusterKey, []byte("{not json"), storage.NoLease); err != nil {
		t.Fatal(err)
	}
	var corrupt *storage.CorruptError
	if _, _, err := s.ReadCluster(ctx); !errors.As(err, &corrupt) {
		t.Fatalf("reading the damaged record: %v, want a *storage.CorruptError", err)
	}
	want := storage.ClusterRecord{NumShards: 16, Strategy: "rendezvous", WrittenBy: "a"}
	if _, err := CheckCluster(ctx, s, want, quiet); err != nil {
		t.Fatalf("over a damaged record: %v, want it replaced", err)
	}
	if info, ok, err := s.ReadCluster(ctx); err != nil || !ok || info.NumShards != 16 {
		t.Fatalf("cluster record = %+v, %v, %v", info, ok, err)
	}
}
