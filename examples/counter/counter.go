package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
)

// Counter is the demo's entity: an in-memory int64. Its state survives a
// graceful move (Release writes a fenced checkpoint, Activate restores it)
// but not a crash: a crashed runner calls no Release, so increments since
// the counter's last checkpoint are lost.
type Counter struct{ n int64 }

// IncReq asks a counter to add one.
type IncReq struct{}

// IncResp is the counter's new value and the runner that served the ask.
type IncResp struct {
	Value  int64
	Runner string
}

// GetReq asks a counter for its value.
type GetReq struct{}

// Kind and methods, defined once at package level and registered on every
// runner (the gateway included: it needs them to route).
var (
	CounterKind = entity.NewKind("counter", func(string) *Counter { return &Counter{} })
	Inc         = entity.Method(CounterKind, "inc", (*Counter).Inc)
	Get         = entity.Method(CounterKind, "get", (*Counter).Get)
)

var (
	_ entity.Activator = (*Counter)(nil)
	_ entity.Releaser  = (*Counter)(nil)
)

// Process-wide tallies of the lifecycle hooks, read by the demo's report.
var (
	checkpointsWritten atomic.Int64
	checkpointsFailed  atomic.Int64
	restored           atomic.Int64 // activations that found a checkpoint
)

// Inc adds one and reports where it ran.
func (c *Counter) Inc(ctx context.Context, _ IncReq) (IncResp, error) {
	c.n++
	info, _ := runner.ShardInfoFrom(ctx)
	return IncResp{Value: c.n, Runner: info.Runner}, nil
}

// Get returns the value.
func (c *Counter) Get(_ context.Context, _ GetReq) (int64, error) { return c.n, nil }

// Activate restores the last checkpoint, if any.
func (c *Counter) Activate(ctx context.Context, info entity.ActivateInfo) error {
	if info.Restore == nil {
		return nil
	}
	data, ok, err := info.Restore(ctx)
	if err != nil || !ok {
		return err
	}
	n, err := strconv.ParseInt(string(data), 10, 64)
	if err != nil {
		return fmt.Errorf("counter %s: bad checkpoint %q: %w", info.Entity, data, err)
	}
	c.n = n
	restored.Add(1)
	return nil
}

// Release checkpoints the value, fenced by the shard's epoch: on graceful
// shutdown, when the shard moves, and on idle passivation.
func (c *Counter) Release(ctx context.Context, info entity.ReleaseInfo) error {
	if info.Checkpoint == nil {
		return nil
	}
	if err := info.Checkpoint(ctx, strconv.AppendInt(nil, c.n, 10)); err != nil {
		checkpointsFailed.Add(1)
		return err
	}
	checkpointsWritten.Add(1)
	return nil
}
