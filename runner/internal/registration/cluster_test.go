package registration

import (
	"context"
	"errors"
	"testing"

	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

func TestEveryRunnerOfAClusterAgreesOnItsSettings(t *testing.T) {
	ctx := context.Background()
	s := memory.New()
	client := storage.ClusterRecord{NumShards: 64, WrittenBy: "client"} // a client-only runner publishes no strategy
	if got, err := CheckCluster(ctx, s, client, quiet); err != nil || got.Strategy != "" {
		t.Fatalf("first runner: %+v, %v, want the record published (no strategy)", got, err)
	}
	host := storage.ClusterRecord{NumShards: 64, Strategy: "rendezvous", WrittenBy: "a"}
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
		{storage.ClusterRecord{NumShards: 128, WrittenBy: "b"}, "NumShards"},
		{storage.ClusterRecord{NumShards: 64, Strategy: "other", WrittenBy: "b"}, "Strategy"},
	} {
		_, err := CheckCluster(ctx, s, c.rec, quiet)
		if !errors.As(err, &mm) || mm.Setting != c.setting || !errors.Is(err, ErrClusterMismatch) {
			t.Errorf("runner with %+v: %v, want a *ClusterMismatchError on %s", c.rec, err, c.setting)
		}
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
