package runner

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// benchController builds a runner (not started) that is attached in a
// cluster of three runners over n shards: it owns its third of the shards,
// the two others own theirs, and the initial full reconcile is done. Its
// control loop's work can then be driven by hand, one event at a time.
func benchController(b *testing.B, n int) *Runner {
	b.Helper()
	c := memory.NewCluster()
	b.Cleanup(c.Close)
	r, err := New(c.NewStore("me"), Config{ID: "me", NumShards: n, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	b.Cleanup(func() { cancel(nil) })
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lifecycle.phase, r.att.gen, r.att.ctx, r.att.stop = phaseAttached, 1, ctx, cancel
	r.att.lease = 100
	for i, id := range []string{"me", "x", "y"} {
		m := storage.Runner{RunnerRecord: storage.RunnerRecord{ID: id, Weight: 1, Incarnation: id}, Lease: storage.LeaseID(100 + i)}
		if id == "me" {
			m.Incarnation = r.incarnation
		}
		r.view.members[id] = m
	}
	r.view.membersSeen = true
	r.view.rebuildByLease()
	r.recomputeLocked()
	for sid, owner := range r.view.assignment.All() {
		id := int(sid)
		l := storage.Lock{Shard: sid, Lease: r.view.members[owner].Lease, Epoch: storage.Epoch(1 + id)}
		r.view.locks.Set(l)
		if owner == "me" {
			r.installWithLocked(sid, l.Epoch, entity.ActivateNew, nil)
		}
	}
	r.work.Take()
	return r
}

// benchSizes are the shard counts the control-loop benchmarks run at: 1k,
// 4k, 16k and 64k, those a runner accepts (up to sharding.MaxShards).
func benchSizes() []int {
	var out []int
	for _, n := range []int{1024, 4096, 16384, 65536} {
		if n <= sharding.MaxShards {
			out = append(out, n)
		}
	}
	return out
}

// BenchmarkControlRoundAfterLockEvent measures the control loop's work for
// one lock event — applying it to the lock view, then one round — as a
// function of the shard count: it must not grow with the cluster (the work
// queue makes a round proportional to what changed).
//
//	foreign: another runner's lock is rewritten (most events a runner sees)
//	own:     a handoff record appears for a shard this runner owns and keeps
func BenchmarkControlRoundAfterLockEvent(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(fmt.Sprintf("foreign/shards=%d", n), func(b *testing.B) {
			r := benchController(b, n)
			var foreign sharding.ShardID
			for id, owner := range r.view.assignment.All() {
				if owner == "x" {
					foreign = id
					break
				}
			}
			lease := r.view.members["x"].Lease
			rev := storage.Revision(n + 1)
			var bg sync.WaitGroup
			b.ReportAllocs()
			for b.Loop() {
				rev++
				ev := storage.Event{Type: storage.EventPut, KV: storage.KeyValue{
					Key: foreign.String(), Value: []byte(`{"runnerID":"x","incarnation":"x"}`), Lease: lease, ModRevision: rev,
				}}
				r.mu.Lock()
				r.applyLockLocked(ev)
				r.mu.Unlock()
				r.round(&bg)
			}
			bg.Wait()
		})
		b.Run(fmt.Sprintf("own/shards=%d", n), func(b *testing.B) {
			r := benchController(b, n)
			var mine sharding.ShardID
			for s := range r.shards.ownedShards() {
				mine = s.id
				break
			}
			lease := r.view.members["x"].Lease
			rev := storage.Revision(n + 1)
			var bg sync.WaitGroup
			b.ReportAllocs()
			for b.Loop() {
				rev++
				kv := storage.KeyValue{
					Key: mine.String(), Lease: lease, ModRevision: rev,
					Value: []byte(`{"from":"me","to":"x","phase":"warming","toIncarnation":"x"}`),
				}
				r.mu.Lock()
				r.applyHandoffLocked(storage.EventPut, kv)
				r.mu.Unlock()
				r.round(&bg)
			}
			bg.Wait()
		})
	}
}

// BenchmarkControlFullReconcile measures what a membership change costs a
// runner (strategy aside): deciding every shard once.
func BenchmarkControlFullReconcile(b *testing.B) {
	for _, n := range benchSizes() {
		b.Run(fmt.Sprintf("shards=%d", n), func(b *testing.B) {
			r := benchController(b, n)
			var bg sync.WaitGroup
			b.ReportAllocs()
			for b.Loop() {
				r.mu.Lock()
				r.allChangedLocked(true)
				r.mu.Unlock()
				r.round(&bg)
			}
			bg.Wait()
		})
	}
}

// rebuildByLease indexes the members by lease, for tests that set them
// directly, and returns the live addresses.
func (v *clusterView) rebuildByLease() map[string]bool {
	clear(v.byLease)
	for _, m := range v.members {
		v.byLease[m.Lease] = m
	}
	return v.liveAddresses()
}
