package runner

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/control"
	"github.com/shardhost/shardhost/runner/internal/handoff"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// TestHandoffRecordSeenBeforeItsShardWasOursIsHonoured: a handoff record
// that arrives while its shard is not owned here (this runner detached, or
// re-attaching and not yet holding the shards it kept) is kept; once the
// shard is ours and assigned to the record's target, the old owner cuts
// over to it. It used to see an empty record and wait HandoffWait for a
// plain release (fault suite, seed 26: converged after 19.4 s).
func TestHandoffRecordSeenBeforeItsShardWasOursIsHonoured(t *testing.T) {
	r := attachedRunner(t, 100, storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "x", Weight: 1, Incarnation: "x1"}, Lease: 101})
	r.mu.Lock()
	defer r.mu.Unlock()

	const shard, epoch = sharding.ShardID(2), storage.Epoch(40)
	val, err := storage.EncodeHandoff(storage.HandoffRecord{From: "me", To: "x", Phase: storage.HandoffReady, ToIncarnation: "x1", FromEpoch: epoch})
	if err != nil {
		t.Fatal(err)
	}
	r.applyHandoffLocked(storage.EventPut, storage.KeyValue{Key: shard.String(), Value: val, Lease: 101, ModRevision: 41})

	// The shard becomes ours (a re-attachment installs what it kept) and
	// is assigned to x.
	r.view.locks.Set(storage.Lock{Shard: shard, Lease: 100, Epoch: epoch})
	r.installWithLocked(shard, epoch, entity.ActivateNew, nil)
	a := make(sharding.Assignment, 4)
	a[shard] = "x"
	r.view.assignment = control.CompactAssignment(a)
	d := r.outboundDecisionLocked(r.shards.owner(shard), time.Now())
	h, cut, plain := d.Record, d.Action == handoff.CutOver, d.Action == handoff.Release
	if !cut || plain || h.To != "x" || h.FromEpoch != epoch {
		t.Fatalf("outbound decision: cut %v, plain %v, record %+v; want a cutover to x", cut, plain, h)
	}
}

// attachedRunner returns runner "me" of 4 shards on an in-memory store,
// set up as attached under lease (generation 1, an attachment context)
// with others in its view of the members; nothing runs.
func attachedRunner(t *testing.T, lease storage.LeaseID, others ...storage.Runner) *Runner {
	t.Helper()
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	r, err := New(c.NewStore("me"), Config{ID: "me", NumShards: 4, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	r.lifecycle.phase, r.att.gen, r.att.lease = phaseAttached, 1, lease
	r.att.ctx, r.att.stop = context.WithCancelCause(t.Context())
	r.view.members["me"] = storage.Runner{RunnerRecord: storage.RunnerRecord{ID: "me", Weight: 1, Incarnation: r.incarnation}, Lease: lease}
	for _, o := range others {
		r.view.members[o.ID] = o
	}
	r.view.membersSeen = true
	r.view.rebuildByLease()
	return r
}
