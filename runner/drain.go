package runner

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/storage"
)

// An operator drains a runner by writing drains/{ID} (storage.KeyspaceDrains;
// cmd/shardhostctl drain) and undrains it by deleting the key. The runner
// follows its own key and publishes its record with Draining set (its
// weight kept) while the key exists; every runner assigns a draining runner
// no shard, so its shards leave by handoff, the graceful path. The request
// lives in its own lease-less key, not in the record, because the record is
// the runner's alone (it repairs foreign writes: internal/registration) and dies
// with its lease: a drained runner that restarts, loses its lease or
// re-attaches registers drained again.

// drainCheckInterval bounds how long the record can disagree with the
// request after a registration that raced with a change of the request.
const drainCheckInterval = time.Second

// drainState is the operator's drain request for this runner.
type drainState struct {
	requested atomic.Bool   // drains/{ID} exists
	kick      chan struct{} // 1-buffered: the request changed
}

// followDrain keeps r.opDrain.requested equal to the existence of
// drains/{ID} and republishes the record when they disagree, until ctx
// ends.
func (r *Runner) followDrain(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { r.publishDrain(ctx) })
	_ = storage.Follow(ctx, r.store, storage.KeyspaceDrains, func(u storage.Update) {
		if u.Err != nil {
			return // the other watches report storage trouble
		}
		on := r.opDrain.requested.Load()
		if u.Reset {
			on = false
			for _, kv := range u.KVs {
				on = on || kv.Key == r.cfg.ID
			}
		}
		for _, ev := range u.Events {
			if ev.KV.Key == r.cfg.ID {
				on = ev.Type == storage.EventPut
			}
		}
		if r.opDrain.requested.Swap(on) != on {
			if on {
				r.log.Info("drain requested (drains/" + r.cfg.ID + "): handing every shard off")
			} else {
				r.log.Info("drain request withdrawn: taking shards again")
			}
			signal(r.opDrain.kick)
		}
	})
}

// publishDrain rewrites the record when its Draining disagrees with the
// request: at once when the request changes, and every
// drainCheckInterval in case a registration raced with the change.
func (r *Runner) publishDrain(ctx context.Context) {
	check := time.NewTicker(drainCheckInterval)
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.opDrain.kick:
		case <-check.C:
		}
		r.republishForDrain()
	}
}

// republishForDrain writes the record for the current request if the
// runner is registered (attached, not shutting down) and its record, as
// the runners watch last showed it after the runner's own last write, says
// otherwise. A failed write is retried at the next check.
func (r *Runner) republishForDrain() {
	on := r.opDrain.requested.Load()
	r.mu.Lock()
	seen, written := r.reg.Seen()
	leaseID, actx := r.att.lease, r.att.ctx
	ok := r.lifecycle.phase == phaseAttached && !r.lifecycle.stopping && !r.lifecycle.draining && leaseID != storage.NoLease
	r.mu.Unlock()
	if !ok || !seen.Known || !seen.Exists || seen.Rev < written || seen.KV.Lease != leaseID {
		return // not registered, a write of ours not seen yet, or damage (guardRecord's)
	}
	if rec, err := storage.DecodeRunner(seen.KV); err != nil || rec.Incarnation != r.incarnation || rec.Draining == on {
		return
	}
	h, _ := r.keeper.Health()
	cctx, cancel := r.opCtx(actx)
	defer cancel()
	if _, err := r.reg.Write(cctx, leaseID, r.recordFor(h.TTL, false)); err != nil {
		if actx.Err() == nil {
			r.log.Warn("cannot publish the drain request in the runner record; retrying", "draining", on, "err", err)
		}
		return
	}
	r.log.Info("runner record published", "draining", on)
}
