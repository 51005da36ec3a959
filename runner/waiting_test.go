package runner_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
)

type waitEcho struct{}

func (*waitEcho) Echo(_ context.Context, s string) (string, error) { return s, nil }

var (
	waitKind  = entity.NewKind("wait-echo", func(string) *waitEcho { return &waitEcho{} })
	waitEchoM = entity.Method(waitKind, "echo", (*waitEcho).Echo)
)

// TestMaxWaitingSends: while no shard has an owner (the runner's store is
// partitioned), sends wait (retrying) up to MaxWaitingSends; the next one
// fails at once with ErrTooManyWaiting. Once the runner owns the shards,
// the waiting sends are delivered.
func TestMaxWaitingSends(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		store := c.NewStore("h")
		store.Partition(true)
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		h, err := runner.New(store, runner.Config{ID: "h", NumShards: 8, MaxWaitingSends: 2, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Register(waitKind); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- h.Run(context.Background()) }()
		waitRunning(t, h)
		defer func() { h.Close(); <-done }()

		type result struct {
			v, want string
			err     error
		}
		waiting := make(chan result, 2)
		for _, id := range []string{"a", "b"} {
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				v, err := waitEchoM.Ask(ctx, h, id, id)
				waiting <- result{v, id, err}
			}()
		}
		time.Sleep(time.Second) // fake time: both sends are retrying

		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, err = waitEchoM.Ask(ctx, h, "c", "c")
		if !errors.Is(err, runner.ErrTooManyWaiting) {
			t.Fatalf("third send while two wait: %v, want ErrTooManyWaiting", err)
		}
		if ctx.Err() != nil {
			t.Fatal("the third send waited for its deadline instead of failing at once")
		}
		if len(h.Owned()) != 0 {
			t.Fatal("the runner owns shards through a partitioned store")
		}

		store.Partition(false)
		for range 2 {
			if r := <-waiting; r.err != nil || r.v != r.want {
				t.Errorf("waiting send after the partition healed: %q, %v; want %q", r.v, r.err, r.want)
			}
		}
	})
}

type waitGate struct {
	gate    chan struct{}
	running *atomic.Int32
}

func (g *waitGate) Pass(ctx context.Context, s string) (string, error) {
	g.running.Add(1)
	select {
	case <-g.gate:
		return s, nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// TestMaxWaitingSendsIgnoresDelivered: remote sends that reached their
// owner and wait for a slow handler do not wait for an owner, so they do
// not count against MaxWaitingSends (real loopback transport).
func TestMaxWaitingSendsIgnoresDelivered(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	gate := make(chan struct{})
	var running atomic.Int32
	kind := entity.NewKind("wait-gate", func(string) *waitGate { return &waitGate{gate: gate, running: &running} })
	pass := entity.Method(kind, "pass", (*waitGate).Pass)
	owner, err := runner.New(c.NewStore("owner"), runner.Config{ID: "owner", NumShards: 8, ListenAddr: "127.0.0.1:0", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := runner.New(c.NewStore("gw"), runner.Config{ID: "gw", NumShards: 8, ClientOnly: true, MaxWaitingSends: 1, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []*runner.Runner{owner, gw} {
		if err := r.Register(kind); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); _ = r.Run(context.Background()) }()
		waitRunning(t, r)
		t.Cleanup(func() { r.Close(); <-done })
	}
	waitFor(t, 10*time.Second, "the gateway routes every shard to the owner", func() bool {
		for s := range 8 {
			if o, _ := gw.OwnerOf(sharding.ShardID(s)); o != "owner" {
				return false
			}
		}
		return len(owner.Owned()) == 8
	})

	const n = 4
	results := make(chan error, n)
	for i := range n {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err := pass.Ask(ctx, gw, fmt.Sprint("e", i), "x")
			results <- err
		}()
	}
	waitFor(t, 10*time.Second, "all asks running on the owner", func() bool {
		return running.Load() == n
	})
	close(gate)
	for range n {
		if err := <-results; err != nil {
			t.Errorf("ask in flight to its owner: %v (MaxWaitingSends 1 must not limit delivered sends)", err)
		}
	}
}
