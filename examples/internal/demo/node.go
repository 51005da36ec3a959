package demo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/etcd"
)

// stopTimeout bounds waiting for a runner to stop: beyond it the demo
// reports the runner as stuck rather than hanging.
const stopTimeout = 20 * time.Second

// Node is one runner with its own etcd client, as it would be in its own
// process.
type Node struct {
	r         *runner.Runner
	cli       *clientv3.Client
	sub       *runner.Subscription // nil without an event handler
	forwarded chan struct{}        // closed when the event forwarder ended
	ran       chan struct{}        // closed when Run returned
	runErr    error                // Run's result, set before ran is closed

	haltOnce sync.Once
}

// StartNode connects a new etcd client to endpoints, creates the runner
// with cfg on a store under namespace, registers kind and starts Run. If
// onEvent is not nil, it is passed the runner's events, from Run's start
// until the node stops, one at a time. The client's warnings are discarded
// unless verbose.
func StartNode(endpoints []string, namespace string, cfg runner.Config, kind entity.Descriptor, onEvent func(runner.Event), verbose bool) (*Node, error) {
	return StartNodeWith(endpoints, namespace, cfg, kind, onEvent, verbose, nil)
}

// StartNodeWith is StartNode with setup called on the runner before Run
// (to register shard workers and singletons).
func StartNodeWith(endpoints []string, namespace string, cfg runner.Config, kind entity.Descriptor, onEvent func(runner.Event), verbose bool, setup func(*runner.Runner) error) (*Node, error) {
	ccfg := etcd.ClientConfig(endpoints)
	if !verbose {
		ccfg.Logger = zap.NewNop()
	}
	cli, err := etcd.NewClient(ccfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", cfg.ID, err)
	}
	store, err := etcd.New(cli, namespace, etcd.Config{})
	if err != nil {
		cli.Close()
		return nil, err
	}
	r, err := runner.New(store, cfg)
	if err == nil {
		err = r.Register(kind)
	}
	if err == nil && setup != nil {
		err = setup(r)
	}
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("runner %s: %w", cfg.ID, err)
	}
	n := &Node{r: r, cli: cli, ran: make(chan struct{})}
	if onEvent != nil {
		n.sub, n.forwarded = r.Subscribe(), make(chan struct{})
		go func() {
			defer close(n.forwarded)
			for ev := range n.sub.Events() {
				onEvent(ev)
			}
		}()
	}
	go func() {
		defer close(n.ran)
		n.runErr = r.Run(context.Background())
	}()
	return n, nil
}

// Runner returns the node's runner.
func (n *Node) Runner() *runner.Runner { return n.r }

// Stop shuts the runner down gracefully (drain, checkpoint, release,
// revoke the lease), waits for Run, ends the event handling and closes the
// client.
//
// Only the first call of Stop or Crash stops the runner and reports how
// that went; later calls return nil.
func (n *Node) Stop(ctx context.Context) error {
	return n.halt("Shutdown", func() error { return n.r.Shutdown(ctx) })
}

// Crash stops the runner the way a killed process would: nothing is
// released and its lease is left to expire. Then, like Stop, it waits for
// Run, ends the event handling and closes the client.
func (n *Node) Crash() error {
	return n.halt("Close", func() error { n.r.Close(); return nil })
}

func (n *Node) halt(what string, fn func() error) (err error) {
	n.haltOnce.Do(func() {
		res := make(chan error, 1)
		go func() {
			err := fn()
			<-n.ran
			if n.runErr != nil {
				err = errors.Join(err, fmt.Errorf("%s: Run: %w", n.r.ID(), n.runErr))
			}
			res <- err
		}()
		select {
		case err = <-res:
			if n.sub != nil {
				n.sub.Close()
				<-n.forwarded
			}
			n.cli.Close()
		case <-time.After(stopTimeout):
			err = fmt.Errorf("%s: %s, then Run, did not return within %v", n.r.ID(), what, stopTimeout)
		}
	})
	return err
}

// StopAll stops nodes concurrently, each within 15s, and returns how long
// it took.
func StopAll(nodes []*Node) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = n.Stop(ctx) })
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

// WaitSettled waits until the live runners all computed the same
// assignment over exactly the live runners, each owns exactly the shards
// it assigns to it, every shard is owned by exactly one of them, and the
// gateway gw sees each shard's lock held by the runner it is assigned to.
// It returns the time waited.
func WaitSettled(ctx context.Context, live []*Node, gw *Node, numShards int, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	ids := make([]string, len(live))
	for i, n := range live {
		ids[i] = n.r.ID()
	}
	for {
		if settled(live, gw, numShards) {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("shards not settled on %s after %v: %s", strings.Join(ids, ", "), timeout, Ownership(live))
		}
		select {
		case <-ctx.Done():
			return time.Since(start), context.Cause(ctx)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// settled is the check of WaitSettled (the same as the churn harness's in
// bench/churn, which the examples module cannot import).
func settled(live []*Node, gw *Node, numShards int) bool {
	var a sharding.Assignment
	for i, n := range live {
		ai := n.r.Assignment()
		if len(ai) != numShards || (i > 0 && !slices.Equal(ai, a)) {
			return false // not every runner computed the same assignment yet
		}
		a = ai
	}
	counts := a.Counts()
	if len(counts) != len(live) {
		return false // the assignment is over other runners than the live ones
	}
	owned := make([]bool, numShards)
	total := 0
	for _, n := range live {
		if counts[n.r.ID()] == 0 {
			return false
		}
		for id := range n.r.Owned() {
			if int(id) >= numShards || owned[id] || a[id] != n.r.ID() {
				return false // owned twice, or by a runner it is not assigned to
			}
			owned[id] = true
			total++
		}
	}
	if total != numShards {
		return false
	}
	for id := range numShards {
		if owner, _ := gw.r.OwnerOf(sharding.ShardID(id)); owner != a[id] {
			return false
		}
	}
	return true
}

// Ownership reads "runner-1 8, runner-2 8 shards": how many shards each
// node owns.
func Ownership(nodes []*Node) string {
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		parts[i] = fmt.Sprintf("%s %d", n.r.ID(), len(n.r.Owned()))
	}
	return strings.Join(parts, ", ") + " shards"
}
