package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// world is the in-process state of one scenario: the log and, per runner,
// what that runner's process would hold (its views, hook tallies and
// handoff events). In a real deployment each runner is its own process and
// its views are a process global; here the entities find them by the
// runner they run on.
type world struct {
	log   *logService
	hosts map[string]*host // by runner ID; fixed before any runner starts
}

// host is one runner's process-local state.
type host struct {
	id    string
	log   *logService
	views views

	consumed atomic.Int64 // records consumed by the shard workers

	mu       sync.Mutex
	warms    []warmCall
	releases []releaseCall
	phases   []runner.HandoffPhase
}

type warmCall struct {
	At       time.Time
	Shard    sharding.ShardID
	Records  int64 // consumed by this warming
	Took     time.Duration
	Err      error
	Complete bool // the view reached the head seen at the start
}

type releaseCall struct {
	At    time.Time
	Shard sharding.ShardID
}

// warmShard is the runner's Config.WarmShard: during a handoff, while the
// old owner still serves the partition, consume it into a view up to its
// current head. The records appended meanwhile are the small tail the
// first read after the cutover consumes.
func (h *host) warmShard(ctx context.Context, shard sharding.ShardID, from string) error {
	start := time.Now()
	v := h.views.get(shard)
	head := h.log.Head(shard)
	n, err := v.consume(ctx, h.log, head)
	v.mu.Lock()
	complete := v.offset >= head
	v.mu.Unlock()
	h.mu.Lock()
	h.warms = append(h.warms, warmCall{At: start, Shard: shard, Records: n, Took: time.Since(start), Err: err, Complete: complete})
	h.mu.Unlock()
	if err != nil {
		return fmt.Errorf("warm partition %d (taking it from %s): consumed %d records: %w", shard, from, n, err)
	}
	return nil
}

// consumeEvery is how often a partition's consumer looks for new records
// once it reached the head.
const consumeEvery = 5 * time.Millisecond

// consumeShard is the shard worker (runner.RunPerShard) that consumes the
// partition into this runner's view while the runner owns the shard: it
// starts when the shard is acquired (after WarmShard on a planned move,
// so it only consumes the tail appended meanwhile; from offset 0 after a
// plain acquisition) and stops before the shard is released (its context
// ends; the release waits for it, then ReleaseShard drops the view).
func (h *host) consumeShard(ctx context.Context, w runner.Work) error {
	v := h.views.get(w.Shard)
	t := time.NewTicker(consumeEvery)
	defer t.Stop()
	for {
		n, err := v.consume(ctx, h.log, h.log.Head(w.Shard))
		h.consumed.Add(n)
		if ctx.Err() != nil {
			return nil // the shard is leaving: the view stays consistent, behind
		}
		if err != nil {
			return fmt.Errorf("consume partition %d: %w", w.Shard, err) // restarted after a back-off
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// releaseShard is the runner's Config.ReleaseShard: the partition's
// entities and its consumer have drained, so nothing uses the view any
// more; drop it. The
// view is not checkpointed: it stands for state too large to copy on
// every move, which the next owner rebuilds from the log (warming).
func (h *host) releaseShard(_ context.Context, shard sharding.ShardID, _ string) error {
	h.views.drop(shard)
	h.mu.Lock()
	h.releases = append(h.releases, releaseCall{At: time.Now(), Shard: shard})
	h.mu.Unlock()
	return nil
}

// hookCalls returns the hook calls made at or after since.
func (h *host) hookCalls(since, until time.Time) (warms []warmCall, releases int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.warms {
		if !w.At.Before(since) && !w.At.After(until) {
			warms = append(warms, w)
		}
	}
	for _, r := range h.releases {
		if !r.At.Before(since) && !r.At.After(until) {
			releases++
		}
	}
	return warms, releases
}

// recordEvent is the runner's event handler: it keeps the handoff events.
func (h *host) recordEvent(ev runner.Event) {
	if p, ok := ev.(runner.HandoffPhase); ok {
		h.mu.Lock()
		h.phases = append(h.phases, p)
		h.mu.Unlock()
	}
}

// handoffPhases returns the handoff events reported so far.
func (h *host) handoffPhases() []runner.HandoffPhase {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.phases)
}

// Key is the demo's entity: one key of a partition. It holds nothing; Get
// answers from the view of the key's partition on the runner it runs on.
type Key struct {
	id string
	w  *world
}

// GetReq asks for a key's value.
type GetReq struct{}

// GetResp is a key's value as of Offset, and what answering cost.
type GetResp struct {
	Sum, Count int64
	Offset     int64  // records of the partition the view had applied
	Replayed   int64  // records this read waited for the consumer to apply before answering
	Runner     string // the runner that answered
}

// newKeyKind defines the "key" kind of one scenario. The kind is defined
// per scenario only because its entities need that scenario's world; its
// name and methods are the same on every runner.
func newKeyKind(w *world) (*entity.Kind[Key], *entity.MethodRef[Key, GetReq, GetResp]) {
	kind := entity.NewKind("key", func(id string) *Key { return &Key{id: id, w: w} })
	get := entity.Method(kind, "get", (*Key).Get)
	return kind, get
}

var errNoShardInfo = errors.New("key: handler context has no shard info")

// Get returns the key's value including every record appended to its
// partition before the read began: it waits until the partition's
// consumer (the shard worker) applied them to this runner's view — the
// tail appended since its last batch, or the whole partition when the view
// is cold — then answers.
func (k *Key) Get(ctx context.Context, _ GetReq) (GetResp, error) {
	info, ok := runner.ShardInfoFrom(ctx)
	h := k.w.hosts[info.Runner]
	if !ok || h == nil {
		return GetResp{}, errNoShardInfo
	}
	idx, ok := k.w.log.index[k.id]
	if !ok {
		return GetResp{}, fmt.Errorf("key %q: no such key", k.id)
	}
	v := h.views.get(info.Shard)
	head := k.w.log.Head(info.Shard)
	v.mu.Lock()
	defer v.mu.Unlock()
	behind := max(head-v.offset, 0)
	if err := v.waitLocked(ctx, head); err != nil {
		return GetResp{}, fmt.Errorf("key %q: waiting for partition %d to be consumed up to %d (at %d): %w", k.id, info.Shard, head, v.offset, err)
	}
	return GetResp{Sum: v.sum[idx], Count: v.count[idx], Offset: v.offset, Replayed: behind, Runner: info.Runner}, nil
}
