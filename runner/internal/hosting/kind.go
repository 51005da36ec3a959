package hosting

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
)

// Kind is a kind registered on this runner. Desc and Opts never change
// after registration.
type Kind struct {
	Desc  entity.Descriptor
	Opts  entity.Options
	name  string    // Desc.Name(), read per message
	idx   int       // the kind's index in registration order (entityTable)
	stats kindStats // read by the debug page (KindCounts)
	warms bool      // its instances implement entity.Warmer (assumed when the kind cannot say)
}

// kindWarms reports whether d's instances can warm (a Descriptor that does
// not say is assumed to).
func kindWarms(d entity.Descriptor) bool {
	w, ok := d.(interface{ Warms() bool })
	return !ok || w.Warms()
}

// EntityKey names an entity: its kind's name and its ID.
type EntityKey struct{ Kind, ID string }

// counterStripes is the number of cache lines a counter is spread over.
const counterStripes = 8

// counter counts events cheaply on hot paths: increments for different
// shards mostly land on different cache lines, so entities running on
// different cores do not contend. Read it with load (a sum, not a
// snapshot: increments racing with it may or may not be included).
type counter [counterStripes]struct {
	n atomic.Uint64
	_ [56]byte // one stripe per 64-byte cache line
}

func (c *counter) add(shard sharding.ShardID) { c[uint32(shard)%counterStripes].n.Add(1) }

func (c *counter) load() uint64 {
	var sum uint64
	for i := range c {
		sum += c[i].n.Load()
	}
	return sum
}

// kindStats are the message counters of one registered kind on this
// runner, since it was registered. The debug page reads them; the
// OpenTelemetry instruments stay the source for monitoring.
type kindStats struct {
	handled  counter // messages whose handler ran (whatever it returned)
	rejected counter // messages refused by a full mailbox
}

// warmParallelism bounds the Warm hooks running at once for one shard.
const warmParallelism = 16

// WarmEntities runs the Warm hook of each entity in hot whose kind is
// registered here and whose instances warm, at most warmParallelism at
// once, bounded by ctx, for shard id coming from runner from. Each
// instance warmed without error is handed to keep (which may drop it).
func (h *Host) WarmEntities(ctx context.Context, id sharding.ShardID, from string, hot []EntityKey, keep func(EntityKey, any)) {
	sem := make(chan struct{}, warmParallelism)
	var wg sync.WaitGroup
	defer wg.Wait()
	for _, key := range hot {
		k := h.Kind(key.Kind)
		if k == nil {
			continue
		}
		inst := k.Desc.New(key.ID)
		w, ok := inst.(entity.Warmer)
		if !ok {
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			defer func() {
				if p := recover(); p != nil {
					h.log.Warn("entity Warm hook panicked", "kind", key.Kind, "shard", id, "panic", p)
				}
			}()
			err := w.Warm(ctx, entity.WarmInfo{Entity: key.ID, Shard: id, From: from, Restore: h.restoreFunc(id, key)})
			if err != nil {
				h.log.Debug("entity Warm hook failed", "kind", key.Kind, "shard", id, "err", err)
				return
			}
			keep(key, inst)
		})
	}
}
