package main

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// With -procs every hosting runner is a separate OS process (this binary,
// re-executed by bench/internal/runnerproc): a crash is a real SIGKILL, a
// graceful stop a SIGTERM, and each runner has its own heap, scheduler
// and sockets. The harness follows a child through the JSON events it
// prints (ownership changes, handoff phases, assignment digests) instead
// of calling its Runner.

// procNode is a hosting runner in a child process.
type procNode struct {
	p *runnerproc.Proc

	mu     sync.Mutex
	seen   int // events taken from p
	owned  map[sharding.ShardID]bool
	digest uint64
}

// startProc starts the child runner id.
func (h *harness) startProc(id string) (*procNode, error) {
	level := "error"
	if h.p.Verbose {
		level = "info"
	}
	ctx, cancel := context.WithTimeout(context.Background(), settleTimeout)
	defer cancel()
	p, err := runnerproc.Start(ctx, runnerproc.Spec{
		Endpoints: []string{h.etcd.Endpoint}, Namespace: h.etcd.Namespace, LogLevel: level,
		StatusPoll: 20 * time.Millisecond,
		Config:     runnerproc.Config{ID: id, NumShards: h.p.Shards, LeaseTTL: h.p.TTL, StartTimeout: h.p.StartTimeout},
	})
	if err != nil {
		return nil, err
	}
	pn := &procNode{p: p, owned: map[sharding.ShardID]bool{}}
	h.rec.wg.Go(func() { // the child's events reach the recorder as they come
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.Done():
				pn.sync(&h.rec)
				return
			case <-tick.C:
				pn.sync(&h.rec)
			}
		}
	})
	return pn, nil
}

// sync takes the child's new events: its ownership and assignment digest
// follow them, and its ownership and handoff events go to rec.
func (pn *procNode) sync(rec *recorder) {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	evs, n := pn.p.EventsSince(pn.seen)
	pn.seen = n
	for _, e := range evs {
		base := runner.EventBase{Runner: pn.p.ID(), Time: e.Time}
		shard := sharding.ShardID(e.Shard)
		var ev runner.Event
		switch e.Kind {
		case runnerproc.KindAcquired:
			pn.owned[shard] = true
			ev = runner.ShardAcquired{EventBase: base, Shard: shard, Epoch: epoch(e.Epoch)}
		case runnerproc.KindReleased:
			delete(pn.owned, shard)
			ev = runner.ShardReleased{EventBase: base, Shard: shard, Epoch: epoch(e.Epoch)}
		case runnerproc.KindLost:
			delete(pn.owned, shard)
			ev = runner.ShardLost{EventBase: base, Shard: shard, Epoch: epoch(e.Epoch), Cause: errors.New(e.Detail)}
		case runnerproc.KindHandoff:
			// Detail: "phase from -> to detail".
			f := strings.Fields(e.Detail)
			if len(f) >= 4 {
				ev = runner.HandoffPhase{EventBase: base, Shard: shard, Phase: f[0], From: f[1], To: f[3]}
			}
		case runnerproc.KindAssignment:
			pn.digest, _ = strconv.ParseUint(e.Detail, 16, 64)
		}
		if ev != nil {
			rec.add(ev)
		}
	}
}

// crashed records the crash of the child at: every shard it owned is lost
// then (a killed process says nothing).
func (pn *procNode) crashed(rec *recorder, at time.Time) {
	pn.sync(rec)
	pn.mu.Lock()
	defer pn.mu.Unlock()
	ids := make([]sharding.ShardID, 0, len(pn.owned))
	for id := range pn.owned {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		rec.add(runner.ShardLost{EventBase: runner.EventBase{Runner: pn.p.ID(), Time: at}, Shard: id, Cause: errors.New("SIGKILL")})
	}
	clear(pn.owned)
}

func (pn *procNode) status() (owned map[sharding.ShardID]bool, digest uint64) {
	pn.mu.Lock()
	defer pn.mu.Unlock()
	return maps.Clone(pn.owned), pn.digest
}

func epoch(e int64) storage.Epoch { return storage.Epoch(e) }

// expectedAssignment is the assignment the live runners must agree on:
// the default strategy over their IDs, equal weights (what the children
// run with).
func expectedAssignment(live []*node, numShards int) (sharding.Assignment, error) {
	rs := make([]sharding.Runner, len(live))
	for i, n := range live {
		rs[i] = sharding.Runner{ID: n.id, Weight: 1}
	}
	return sharding.Default().Assign(sharding.Input{NumShards: numShards, Runners: rs})
}

// procsCPU returns the CPU time the hosting runners' processes used.
func procsCPU(live []*node) time.Duration {
	return cpuSince(nil, procsCPUByPID(live))
}

// procsCPUByPID returns the CPU time of every live runner process by PID.
func procsCPUByPID(live []*node) map[int]time.Duration {
	out := map[int]time.Duration{}
	for _, n := range live {
		if n.proc != nil {
			if d := pidCPU(n.proc.p.PID()); d >= 0 {
				out[n.proc.p.PID()] = d
			}
		}
	}
	return out
}

// cpuSince sums the CPU the processes of after used since before (a
// process new in after counts whole; one gone from after, stopped or
// killed meanwhile, is not counted: its last CPU reading is lost).
func cpuSince(before, after map[int]time.Duration) time.Duration {
	var total time.Duration
	for pid, d := range after {
		total += d - before[pid]
	}
	return total
}
