package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardhost/shardhost/runner/internal/handoff"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/runner/internal/tracing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// The new owner's side of a handoff (DESIGN.md "Handoff", steps 1, 2 and
// 4): takeovers are decided in a round (control.Decide), run here
// (record warming, warm, record ready) and completed when the lock
// arrives under this runner's lease. Their phases and decisions are
// package handoff's; the store calls and the takeover's record
// (shardstate.go) are the runner's.

// inboundItem is one takeover started in a round.
type inboundItem struct {
	id sharding.ShardID
	in *handoff.Inbound
}

// newInboundLocked registers a takeover of shard id from its live owner
// from; runInbound runs it.
func (r *Runner) newInboundLocked(id sharding.ShardID, from storage.Runner, fromEpoch storage.Epoch) inboundItem {
	in := handoff.NewInbound(r.life.inboundContext(r.att.ctx, id, from, fromEpoch), from, fromEpoch, time.Now())
	r.shards.startInbound(id, in)
	r.log.Debug("handoff: taking shard over", "shard", id, "from", from.ID)
	return inboundItem{id: id, in: in}
}

// runInbound is the new owner's side of the takeovers started in one
// round: record warming (one transaction per MaxShardsPerTxn shards), warm
// every shard (concurrently, bounded), record ready (batched again). The
// cutover itself arrives through the lock watch. A takeover cancelled
// meanwhile (reassigned, detached) is skipped from then on: whoever
// cancelled it cleans up.
func (r *Runner) runInbound(gen uint64, actx context.Context, leaseID storage.LeaseID, items []inboundItem) {
	start := time.Now()
	items = r.putInbound(gen, actx, leaseID, items, storage.HandoffWarming)
	for _, it := range items {
		r.reportInbound(it.id, it.in, handoff.Warming, "", "")
	}
	sem := make(chan struct{}, warmParallelism)
	var wg sync.WaitGroup
	timedOut := make([]bool, len(items))
	for i, it := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			wctx, cancel := context.WithTimeout(it.in.Context(), r.cfg.WarmTimeout)
			defer cancel()
			r.warm(wctx, it.id, it.in)
			timedOut[i] = errors.Is(wctx.Err(), context.DeadlineExceeded) && it.in.Context().Err() == nil
			if span := r.life.inboundSpan(it.in); span != nil && it.in.Context().Err() == nil {
				if timedOut[i] {
					lifeEvent(span, tracing.EventWarmTimeout)
				} else {
					lifeEvent(span, tracing.EventWarmed)
				}
			}
		})
	}
	wg.Wait()
	ready := items[:0:0]
	for i, it := range items {
		if it.in.Context().Err() != nil {
			continue // aborted while warming
		}
		r.met.handoffPhase.Record(context.Background(), time.Since(start).Seconds(), r.met.attrs, withPhase("warm"))
		if timedOut[i] {
			if r.cfg.AbortOnWarmTimeout {
				r.abortInbound(gen, leaseID, []inboundItem{it}, fmt.Sprintf("warming exceeded WarmTimeout %v", r.cfg.WarmTimeout), abortWarmTimeout, true)
				continue
			}
			r.log.Warn("warming timed out; proceeding cold", "shard", it.id, "from", it.in.From().ID, "timeout", r.cfg.WarmTimeout)
		}
		// Reported before the write: the old owner may act on the record
		// before our call returns, and observers must see ready first.
		if !r.reportInbound(it.id, it.in, handoff.Ready, "", "") {
			continue // ended meanwhile (aborted, or the lock came)
		}
		ready = append(ready, it)
	}
	r.putInbound(gen, actx, leaseID, ready, storage.HandoffReady)
}

// warmParallelism bounds the shards one runner warms at once.
const warmParallelism = 16

// putInbound writes the handoff records of the takeovers still running at
// phase, in batches, aborts those whose write failed and returns the rest.
// The call runs under the attachment's context actx, not under one
// takeover's: a takeover that ends meanwhile (its lock came, it was
// restarted or abandoned) must not fail the others' records; a record it
// leaves behind is deleted by the stale-record rule
// (control.Decision.DeleteRecord).
func (r *Runner) putInbound(gen uint64, actx context.Context, leaseID storage.LeaseID, items []inboundItem, phase storage.HandoffPhase) []inboundItem {
	live := items[:0:0]
	puts := make([]storage.HandoffPut, 0, len(items))
	for _, it := range items {
		if it.in.Context().Err() == nil {
			live = append(live, it)
			puts = append(puts, storage.HandoffPut{Shard: it.id, Record: storage.HandoffRecord{
				From: it.in.From().ID, To: r.cfg.ID, Phase: phase, ToIncarnation: r.incarnation, FromEpoch: it.in.FromEpoch(),
			}})
		}
	}
	if len(live) == 0 {
		return nil
	}
	// At most shardsPerCall records per call, each call bounded by
	// OpTimeout: a runner joining a large cluster takes thousands of
	// shards at once (3 120 at 20 x 65 536), more than one call writes in
	// time on a busy etcd.
	res := make([]storage.HandoffResult, 0, len(puts))
	for chunk := range slices.Chunk(puts, shardsPerCall) {
		cctx, cancel := r.opCtx(actx)
		part, err := r.store.PutHandoffs(cctx, leaseID, chunk)
		cancel()
		if part == nil { // invalid arguments: nothing written
			part = make([]storage.HandoffResult, len(chunk))
			for i := range part {
				part[i].Err = err
			}
		}
		res = append(res, part...)
	}
	ok := live[:0:0]
	var failed []inboundItem
	var why error
	r.mu.Lock()
	for i, it := range live {
		if res[i].Err != nil {
			failed, why = append(failed, it), res[i].Err
			continue
		}
		if r.att.gen == gen {
			r.shards.recordWritten(it.id, it.in.From().ID, res[i].Revision, phase)
		}
		ok = append(ok, it)
	}
	r.mu.Unlock()
	if len(failed) > 0 {
		// A warming record that failed may still have been written (the
		// outcome of a failed call is unknown): delete what is ours.
		r.abortInbound(gen, leaseID, failed, fmt.Sprintf("record %s: %v", phase, why), abortRecord, true)
	}
	return ok
}

// warm runs the shard-level WarmShard hook and the entity-level Warm hooks
// of the entities the old owner reports as hot, bounded by ctx.
func (r *Runner) warm(ctx context.Context, id sharding.ShardID, in *handoff.Inbound) {
	from := in.From()
	if r.cfg.WarmShard != nil {
		if err := r.cfg.WarmShard(ctx, id, from.ID); err != nil {
			r.log.Warn("WarmShard hook failed", "shard", id, "from", from.ID, "err", err)
		}
	}
	if from.Address == "" || r.cfg.HotSetLimit <= 0 || !r.hosting.CanWarm() {
		return // nothing to ask for: no registered kind can warm
	}
	hot, err := r.net.Hot(ctx, from.Address, uint32(id), r.cfg.HotSetLimit)
	if err != nil {
		if ctx.Err() == nil {
			r.log.Warn("cannot list the hot entities to warm", "shard", id, "from", from.ID, "err", err)
		}
		return
	}
	keys := make([]hosting.EntityKey, len(hot))
	for i, ref := range hot {
		keys[i] = hosting.EntityKey{Kind: ref.Kind, ID: ref.ID}
	}
	r.hosting.WarmEntities(ctx, id, from.ID, keys, in.Warmed) // dropped once installed
}

// abortInbound ends takeovers from the goroutine running them (errType
// classifies why for their spans); with deleteRecords their handoff
// records are deleted (batched).
func (r *Runner) abortInbound(gen uint64, leaseID storage.LeaseID, items []inboundItem, why, errType string, deleteRecords bool) {
	var records []storage.HandoffRef
	r.mu.Lock()
	retry := time.Now().Add(r.cfg.AcquireRetryWindow + r.cfg.AcquireRetryInterval)
	for _, it := range items {
		// Only the current takeover owns the record: a replaced one must
		// not delete its successor's.
		if r.shards.at(it.id).inbound != it.in {
			continue
		}
		r.shards.endInbound(it.id)
		r.shards.holdTakeovers(it.id, retry)
		r.retryLocked(it.id, retry)
		if r.att.gen == gen {
			from := it.in.From().ID
			if rec := r.shards.at(it.id).record; rec != nil {
				from = rec.from
			}
			records = append(records, storage.HandoffRef{Shard: it.id, From: from})
		}
	}
	actx := r.att.ctx
	r.mu.Unlock()
	for _, it := range items {
		r.reportInbound(it.id, it.in, handoff.Aborted, why, errType) // cancels it
	}
	r.log.Warn("handoff aborted", "shards", len(items), "first", items[0].id, "from", items[0].in.From().ID, "why", why)
	if deleteRecords && len(records) > 0 {
		r.deleteHandoffs(actx, leaseID, records)
	}
}
