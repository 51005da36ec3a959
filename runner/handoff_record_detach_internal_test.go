package runner

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/shardhost/shardhost/detachment"
	"github.com/shardhost/shardhost/runner/internal/control"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// TestStaleRecordIsDeletedAgainAfterADetachCutItsDelete: a handoff record
// of this runner's lease with no takeover behind it is deleted once per
// revision. When a detach cancels that delete before it reached the store,
// the record is still there after a re-attachment on the same lease; the
// re-attachment lists what its lease holds and deletes it (it used to keep
// the mark through the detach, so the record stayed for as long as the
// lease lived).
func TestStaleRecordIsDeletedAgainAfterADetachCutItsDelete(t *testing.T) {
	r := attachedRunner(t, 0)
	ctx := t.Context()
	l, err := r.store.Grant(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lease := l.ID
	const shard = sharding.ShardID(2)
	rev, err := storage.PutHandoff(ctx, r.store, lease, shard, storage.HandoffRecord{From: "x", To: "me", Phase: storage.HandoffWarming, ToIncarnation: r.incarnation, FromEpoch: 40})
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	r.att.lease = lease
	r.view.assignment = control.CompactAssignment(make(sharding.Assignment, 4)) // the shard is not wanted here: nothing but the record to decide
	r.shards.recordWritten(shard, "x", rev, storage.HandoffWarming)

	deletes := func() bool {
		st := control.Round{Now: time.Now(), Self: "me", Lease: lease, Registered: true}
		var p plan
		r.decideLocked(shard, &st, &p)
		return slices.Contains(p.records, storage.HandoffRef{Shard: shard, From: "x"})
	}
	if !deletes() {
		t.Fatal("the stale record of our lease is not deleted")
	}
	if deletes() {
		t.Fatal("the record is deleted twice at one revision within one attachment")
	}
	// The detach cancels the delete (deleteHandoffs returns at once on the
	// attachment's ended context); the lease survives, the record too.
	r.detachLocked(detachment.ReasonLeaseDeadline, "test")
	if !r.toLocked(onAttach) {
		t.Fatal("cannot re-attach")
	}
	r.att.gen++
	r.att.ctx, r.att.stop = context.WithCancelCause(t.Context())
	r.mu.Unlock()
	if _, err := r.rewriteKept(ctx, lease); err != nil {
		t.Fatal(err)
	}
	snap, err := r.store.List(ctx, storage.HandoffsFrom("x"))
	if err != nil || len(snap.KVs) != 0 {
		t.Fatalf("after the re-attachment: records %v, %v; want the stale one deleted", snap.KVs, err)
	}
}
