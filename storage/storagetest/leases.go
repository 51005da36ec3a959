package storagetest

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// Leases and runner records.

func testLeases(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	id := grant(t, s, 5*time.Second)
	ttl, err := s.KeepAliveOnce(ctx, id)
	if err != nil || ttl < 5*time.Second {
		t.Fatalf("KeepAliveOnce = %v, %v; want >= 5s, nil", ttl, err)
	}
	if err := s.Revoke(ctx, id); err != nil {
		t.Fatalf("Revoke = %v", err)
	}
	if _, err := s.KeepAliveOnce(ctx, id); !errors.Is(err, storage.ErrLeaseNotFound) {
		t.Fatalf("KeepAliveOnce(revoked) = %v, want ErrLeaseNotFound", err)
	}
	if err := s.Revoke(ctx, id); !errors.Is(err, storage.ErrLeaseNotFound) {
		t.Fatalf("Revoke(revoked) = %v, want ErrLeaseNotFound", err)
	}
	if _, err := s.PutRunner(ctx, id, storage.RunnerRecord{ID: "r", Incarnation: "i", Weight: 1}); !errors.Is(err, storage.ErrLeaseNotFound) {
		t.Fatalf("PutRunner(revoked lease) = %v, want ErrLeaseNotFound", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("Ping = %v", err)
	}
}

func testLeaseExpiry(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	l, err := s.Grant(ctx, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutRunner(ctx, l.ID, storage.RunnerRecord{ID: "dying", Incarnation: "1", Weight: 1}); err != nil {
		t.Fatal(err)
	}
	acquire(t, s, l.ID, owner("dying", "1"), 1, 2, 3)
	_, rev := locks(t, s)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	shardsW := s.Watch(wctx, storage.KeyspaceShards, rev+1)
	runnersW := s.Watch(wctx, storage.KeyspaceRunners, rev+1)
	start := time.Now()
	evs := nextEvents(t, shardsW, 3)
	rev2 := nextEvents(t, runnersW, 1)
	t.Logf("lease of TTL %v expired after %v", l.TTL, time.Since(start))
	var deleted []string
	for _, e := range evs {
		if e.Type != storage.EventDelete {
			t.Fatalf("event %+v, want DELETE", e)
		}
		deleted = append(deleted, e.KV.Key)
	}
	slices.Sort(deleted)
	if !slices.Equal(deleted, []string{"1", "2", "3"}) {
		t.Fatalf("deleted %v, want [1 2 3]", deleted)
	}
	if rev2[0].Type != storage.EventDelete || rev2[0].KV.Key != "dying" {
		t.Fatalf("runner event %+v, want DELETE dying", rev2[0])
	}
	if _, err := s.KeepAliveOnce(ctx, l.ID); !errors.Is(err, storage.ErrLeaseNotFound) {
		t.Fatalf("KeepAliveOnce(expired) = %v, want ErrLeaseNotFound", err)
	}
	if got, _ := locks(t, s); len(got) != 0 {
		t.Fatalf("locks after expiry: %v", got)
	}
}

// testRunnerClaims: PutRunner writes only an absent record or one under the
// caller's lease; anything else takes ReplaceRunner at the revision read.
func testRunnerClaims(t *testing.T, in Instance) {
	s := in.Store
	ctx := ctxT(t)
	la, lb := grant(t, s, 30*time.Second), grant(t, s, 30*time.Second)
	rec := func(inc, addr string) storage.RunnerRecord {
		return storage.RunnerRecord{ID: "r", Incarnation: inc, Weight: 1, Address: addr}
	}
	if _, err := s.PutRunner(ctx, la, rec("a", "")); err != nil {
		t.Fatalf("PutRunner(absent) = %v", err)
	}
	revA, err := s.PutRunner(ctx, la, rec("a", "127.0.0.1:1"))
	if err != nil {
		t.Fatalf("PutRunner(own lease) = %v", err)
	}
	var ce *storage.RunnerConflictError
	if _, err := s.PutRunner(ctx, lb, rec("b", "")); !errors.As(err, &ce) || ce.Existing.Lease != la || ce.Existing.ModRevision != revA {
		t.Fatalf("PutRunner(other lease) = %v, want a conflict with lease %x at revision %d", err, la, revA)
	}
	if _, err := s.ReplaceRunner(ctx, lb, rec("b", ""), revA-1); !errors.As(err, &ce) || ce.Existing.ModRevision != revA {
		t.Fatalf("ReplaceRunner(stale revision) = %v, want a conflict at revision %d", err, revA)
	}
	revB, err := s.ReplaceRunner(ctx, lb, rec("b", ""), revA)
	if err != nil || revB <= revA {
		t.Fatalf("ReplaceRunner(current revision) = %d, %v", revB, err)
	}
	snap, err := s.List(ctx, storage.KeyspaceRunners)
	if err != nil || len(snap.KVs) != 1 {
		t.Fatalf("List(runners) = %v, %v", snap.KVs, err)
	}
	if r, err := storage.DecodeRunner(snap.KVs[0]); err != nil || r.Incarnation != "b" || r.Lease != lb || r.ModRevision != revB {
		t.Fatalf("runner record = %+v, %v; want incarnation b under lease %x at %d", r, err, lb, revB)
	}
	// A record without a lease is never a live registration, but PutRunner
	// still leaves it alone: the caller decides (ReplaceRunner).
	if err := in.RawPut(ctx, "runners/r", []byte("garbage"), storage.NoLease); err != nil {
		t.Fatal(err)
	}
	_, err = s.PutRunner(ctx, lb, rec("b", ""))
	if !errors.As(err, &ce) || ce.Existing.Lease != storage.NoLease || string(ce.Existing.Value) != "garbage" {
		t.Fatalf("PutRunner(over a lease-less record) = %v, want a conflict showing it", err)
	}
	if _, err := s.ReplaceRunner(ctx, lb, rec("b", ""), ce.Existing.ModRevision); err != nil {
		t.Fatalf("ReplaceRunner(lease-less record) = %v", err)
	}
	if err := in.RawDelete(ctx, "runners/r"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReplaceRunner(ctx, lb, rec("b", ""), revB); !errors.As(err, &ce) || ce.Exists {
		t.Fatalf("ReplaceRunner(absent) = %v, want a conflict with Exists false", err)
	}
}
