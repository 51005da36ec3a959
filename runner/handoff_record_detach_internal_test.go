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
// the record is still there at the same revision after a re-attachment on
// the same lease; the re-attached runner must delete it again, not take
// it for a delete still under way (it used to keep the mark through the
// detach, so the record stayed for as long as the lease lived).
func TestStaleRecordIsDeletedAgainAfterADetachCutItsDelete(t *testing.T) {
	const lease = storage.LeaseID(100)
	r := attachedRunner(t, lease)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.view.assignment = make([]string, 4) // the shard is not wanted here: nothing but the record to decide

	const shard = sharding.ShardID(2)
	val, err := storage.EncodeHandoff(storage.HandoffRecord{From: "x", To: "me", Phase: storage.HandoffWarming, ToIncarnation: r.incarnation, FromEpoch: 40})
	if err != nil {
		t.Fatal(err)
	}
	r.applyHandoffLocked(storage.EventPut, storage.KeyValue{Key: shard.String(), Value: val, Lease: lease, ModRevision: 41})

	deletes := func() bool {
		st := control.Round{Now: time.Now(), Self: "me", Lease: lease, Registered: true}
		var p plan
		r.decideLocked(shard, &st, &p)
		return slices.Contains(p.records, shard)
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
	r.gen++
	r.attachCtx, r.attachStop = context.WithCancelCause(t.Context())
	if !deletes() {
		t.Fatal("after the re-attachment the record, still there at the same revision, is not deleted again")
	}
}
