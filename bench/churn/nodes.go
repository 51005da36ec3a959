package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/etcd"
)

// The churn's runners: started, stopped, crashed, and what each sees.

// node is one runner with its own etcd client, as if in its own process.
// Its subscription stays open until the end, so every event it emitted is
// recorded.
type node struct {
	id     string
	r      *runner.Runner // nil for a runner in a child process (-procs)
	proc   *procNode      // the child process (-procs), else nil
	cli    *clientv3.Client
	sub    *runner.Subscription
	ran    chan struct{} // closed when Run returned
	runErr error         // Run's result, set before ran is closed

	closeCli sync.Once
}

// closeClient closes the node's etcd client (once).
func (n *node) closeClient() { n.closeCli.Do(func() { _ = n.cli.Close() }) }

// recorder merges the events of every runner, stamped by the runners, and
// follows from them what the cold start's progress reports without taking
// any runner's lock.
type recorder struct {
	mu       sync.Mutex
	events   []runner.Event
	last     time.Time       // when the last event arrived
	detached map[string]bool // runners whose last lifecycle event was Detached
	counts   struct{ detaches, aborts int }
	wg       sync.WaitGroup
}

func (rec *recorder) follow(sub *runner.Subscription) {
	rec.wg.Go(func() {
		for ev := range sub.Events() {
			rec.add(ev)
		}
	})
}

// lastRegistered returns how long after since the last Registered event
// before until came (0: none).
func (rec *recorder) lastRegistered(since, until time.Time) time.Duration {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var last time.Duration
	for _, ev := range rec.events {
		if r, ok := ev.(runner.Registered); ok && r.Time.After(since) && !r.Time.After(until) {
			last = max(last, r.Time.Sub(since))
		}
	}
	return last
}

func (rec *recorder) add(ev runner.Event) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rec.events = append(rec.events, ev)
	rec.last = time.Now()
	switch e := ev.(type) {
	case runner.Detached:
		if rec.detached == nil {
			rec.detached = map[string]bool{}
		}
		rec.detached[e.Runner] = true
		rec.counts.detaches++
	case runner.Reattached:
		delete(rec.detached, e.Runner)
	case runner.HandoffPhase:
		if e.Phase == runner.PhaseAborted {
			rec.counts.aborts++
		}
	}
}

// progress returns the runners detached now, and the Detached events and
// aborted handoff phases so far.
func (rec *recorder) progress() (detachedNow, detaches, aborts int) {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return len(rec.detached), rec.counts.detaches, rec.counts.aborts
}

// quiet waits until no event arrived for d (at most limit).
func (rec *recorder) quiet(d, limit time.Duration) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		rec.mu.Lock()
		since := time.Since(rec.last)
		rec.mu.Unlock()
		if since >= d {
			return
		}
		time.Sleep(d - since)
	}
}

// all returns the events sorted by their time (stable: one runner's events
// keep their order).
func (rec *recorder) all() []runner.Event {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := slices.Clone(rec.events)
	slices.SortStableFunc(out, func(a, b runner.Event) int { return a.Base().Time.Compare(b.Base().Time) })
	return out
}

// startNodes starts n hosting runners concurrently (StartRate a second
// if set, else all at once).
func (h *harness) startNodes(n int) ([]*node, error) {
	ids := make([]string, n)
	for i := range ids {
		h.ids++
		ids[i] = fmt.Sprintf("r%d", h.ids)
	}
	nodes := make([]*node, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		if h.p.StartRate > 0 {
			sleepUntil(context.Background(), start.Add(time.Duration(float64(i)/h.p.StartRate*float64(time.Second))))
		}
		wg.Go(func() { nodes[i], errs[i] = h.newNode(ids[i]) })
	}
	wg.Wait()
	for i := range n {
		if nodes[i] != nil {
			h.nodes = append(h.nodes, nodes[i]) // closed by cleanup, also on error
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return nodes, nil
}

// startNode creates a hosting runner with the next ID, subscribes to its
// events and starts Run.
func (h *harness) startNode() (*node, error) {
	h.ids++
	n, err := h.newNode(fmt.Sprintf("r%d", h.ids))
	if err != nil {
		return nil, err
	}
	h.nodes = append(h.nodes, n)
	return n, nil
}

// newNode creates and runs the hosting runner id. Safe for concurrent use.
func (h *harness) newNode(id string) (*node, error) {
	if h.p.Procs {
		pn, err := h.startProc(id)
		if err != nil {
			return nil, err
		}
		ran := make(chan struct{})
		go func() { <-pn.p.Done(); close(ran) }()
		return &node{id: id, proc: pn, ran: ran}, nil
	}
	r, cli, err := openRunner(h.etcd.Endpoint, h.etcd.Namespace, h.p.Verbose, runner.Config{
		ID: id, NumShards: h.p.Shards, LeaseTTL: h.p.TTL, StartTimeout: h.p.StartTimeout, Logger: h.log, ListenAddr: "127.0.0.1:0",
	})
	if err != nil {
		return nil, err
	}
	n := &node{id: id, r: r, cli: cli, sub: r.Subscribe(), ran: make(chan struct{})}
	h.rec.follow(n.sub) // subscribed before Run: no event is missed
	go func() {
		defer close(n.ran)
		n.runErr = r.Run(context.Background())
	}()
	return n, nil
}

// openRunner creates the runner of cfg on a store of its own under
// namespace, with an etcd client of its own (as if in its own process),
// hosting (or routing) the counters and runnerproc's kind.
func openRunner(endpoint, namespace string, verbose bool, cfg runner.Config) (*runner.Runner, *clientv3.Client, error) {
	cli, err := newEtcdClient(endpoint, verbose)
	if err != nil {
		return nil, nil, err
	}
	store, err := etcd.New(cli, namespace, etcd.Config{})
	if err != nil {
		cli.Close()
		return nil, nil, err
	}
	r, err := runner.New(store, cfg)
	if err == nil {
		err = r.Register(counterKind, runnerproc.Kind)
	}
	if err != nil {
		cli.Close()
		return nil, nil, fmt.Errorf("runner %s: %w", cfg.ID, err)
	}
	return r, cli, nil
}

// stopNode shuts n down gracefully (bounded by stopTimeout) and closes its
// client.
func (h *harness) stopNode(n *node) error {
	ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
	defer cancel()
	if n.proc != nil {
		err := n.proc.p.Stop(ctx) // SIGTERM: the child shuts down gracefully
		n.proc.sync(&h.rec)
		return err
	}
	err := n.r.Shutdown(ctx)
	<-n.ran
	n.closeClient()
	return errors.Join(err, n.runErr)
}

// crash stops n abruptly at at: Close in process, SIGKILL for a child.
func (n *node) crash(rec *recorder, at time.Time) {
	if n.proc != nil {
		_ = n.proc.p.Kill()
		n.proc.crashed(rec, at)
		return
	}
	n.r.Close()
	n.closeClient()
}

// view returns the shards n owns and the digest of its assignment.
func (n *node) view(rec *recorder) (map[sharding.ShardID]bool, uint64) {
	if n.proc != nil {
		n.proc.sync(rec)
		return n.proc.status()
	}
	owned := map[sharding.ShardID]bool{}
	for id := range n.r.Owned() {
		owned[id] = true
	}
	return owned, n.r.Status().AssignmentDigest
}

// stopAll ends the run: the live runners shut down gracefully, together
// (or are closed when interrupted), then the gateway (with the load
// child).
func (h *harness) stopAll(abrupt bool) {
	var wg sync.WaitGroup
	for _, n := range h.live {
		if abrupt {
			wg.Go(func() { n.crash(&h.rec, time.Now()) })
			continue
		}
		wg.Go(func() {
			if err := h.stopNode(n); err != nil {
				h.say("final shutdown of %s: %v", n.id, err)
			}
		})
	}
	wg.Wait()
	h.live = nil
	h.load.close()
}

// cleanup closes every runner, subscription and client (idempotent calls).
func (h *harness) cleanup() {
	for _, n := range h.nodes {
		if n.proc != nil {
			_ = n.proc.p.Kill()
			<-n.ran
			continue
		}
		n.r.Close()
		n.sub.Close()
		n.closeClient()
	}
	if h.load != nil {
		h.load.close()
	}
	h.rec.wg.Wait()
}
