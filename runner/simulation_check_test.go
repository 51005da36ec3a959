package runner_test

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// The simulation's checks: the world that sees every handler run (at
// most one owner executing a shard), fencing, and the partition.

// simWorld records every handler execution across the runners.
type simWorld struct {
	mu         sync.Mutex
	next       int64
	active     map[sharding.ShardID]map[int64]simExec // running executions by shard
	overlapped map[int64]bool                         // executions another runner's handler overlapped
	started    map[int64]time.Time                    // when each execution started
	lost       []time.Time                            // release checkpoints that failed
	violations []string
	rem        *simReminders // the reminders' fires (simulation_reminders_test.go)
	always     *simAlways    // workers, singletons, remembered entities (simulation_always_test.go)
}

type simExec struct {
	runner   string
	stubborn bool
	epoch    storage.Epoch
}

func (w *simWorld) begin(info runner.ShardInfo, stubborn bool) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next++
	id := w.next
	w.started[id] = time.Now()
	for other, e := range w.active[info.Shard] {
		if e.runner == info.Runner {
			continue
		}
		// The execution under the older epoch belongs to an owner that
		// lost the shard while it ran: its result must be withheld.
		if e.epoch < info.Epoch {
			w.overlapped[other] = true
		} else {
			w.overlapped[id] = true
		}
		if !e.stubborn && !stubborn {
			w.violations = append(w.violations, fmt.Sprintf("shard %d: handlers respecting their context ran on %s (epoch %d) and %s (epoch %d) at once",
				info.Shard, e.runner, e.epoch, info.Runner, info.Epoch))
		}
	}
	if w.active[info.Shard] == nil {
		w.active[info.Shard] = map[int64]simExec{}
	}
	w.active[info.Shard][id] = simExec{runner: info.Runner, stubborn: stubborn, epoch: info.Epoch}
	return id
}

func (w *simWorld) end(id int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.active {
		delete(m, id)
	}
}

func (w *simWorld) running() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.active {
		n += len(m)
	}
	return n
}

// stubbornRunning reports whether a handler that ignores its context runs.
func (w *simWorld) stubbornRunning() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.active {
		for _, e := range m {
			if e.stubborn {
				return true
			}
		}
	}
	return false
}

func (w *simWorld) violate(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
}

func simPartitionOK(ns []*simNode) (bool, string) {
	if len(ns) == 0 {
		return false, "no runner"
	}
	a := ns[0].r.Assignment()
	owner := make([]string, simShards)
	for _, n := range ns {
		if !slices.Equal(n.r.Assignment(), a) {
			return false, "runners disagree on the assignment"
		}
		for id := range n.r.Owned() {
			if owner[id] != "" {
				return false, fmt.Sprintf("shard %d owned by %s and %s", id, owner[id], n.id)
			}
			owner[id] = n.id
		}
	}
	for id := range simShards {
		if len(a) != simShards || owner[id] != a[id] {
			return false, fmt.Sprintf("shard %d owned by %q, assigned to %q", id, owner[id], a[id])
		}
	}
	return true, ""
}

// check applies the invariants to what the run recorded.
// checkFencing reads the store's history back: every checkpoint it
// accepted was written under the epoch its shard's lock had at that
// revision (the lock's ModRevision), whatever the runners believed.
func (s *simRun) checkFencing() {
	hist, complete := s.c.History()
	if !complete {
		s.w.violate("the store's history was compacted: the fencing check needs all of it")
		return
	}
	lockEpoch := map[string]int64{}
	for _, e := range hist {
		ks, rest, _ := strings.Cut(e.KV.Key, "/")
		switch {
		case ks == string(storage.KeyspaceShards) && e.Type == storage.EventPut:
			lockEpoch[rest] = int64(e.KV.ModRevision)
		case ks == string(storage.KeyspaceShards):
			delete(lockEpoch, rest)
		case (ks == string(storage.KeyspaceReminders) || ks == string(storage.KeyspaceRemembered)) && e.Type == storage.EventPut:
			shardStr, _, _ := strings.Cut(rest, "/")
			epoch, err := stateEpoch(ks, rest, e.KV)
			if err != nil {
				s.w.violate("state record %q: %v", e.KV.Key, err)
				continue
			}
			s.stats.stateWrites++
			if int64(epoch) != lockEpoch[shardStr] {
				s.w.violate("stale write accepted: %q at revision %d under epoch %d, the lock's epoch then was %d",
					e.KV.Key, e.KV.ModRevision, epoch, lockEpoch[shardStr])
			}
		case ks == "checkpoints" && e.Type == storage.EventPut:
			shardStr, name, _ := strings.Cut(rest, "/")
			id, err := sharding.ParseShardID(shardStr)
			if err != nil {
				s.w.violate("checkpoint key %q: %v", e.KV.Key, err)
				continue
			}
			cp, err := storage.DecodeCheckpoint(id, name, e.KV.Value, e.KV.ModRevision)
			if err != nil {
				s.w.violate("checkpoint %q: %v", e.KV.Key, err)
				continue
			}
			s.stats.checkpoints++
			if int64(cp.Epoch) != lockEpoch[shardStr] {
				s.w.violate("stale write accepted: checkpoint %q at revision %d under epoch %d, the lock's epoch then was %d",
					e.KV.Key, e.KV.ModRevision, cp.Epoch, lockEpoch[shardStr])
			}
		}
	}
}

func (s *simRun) check(l *simLoad) {
	// Acknowledged results of executions another runner overlapped.
	for id, acks := range l.acks {
		for _, a := range acks {
			if s.w.overlapped[a.exec] {
				s.w.violate("entity %s: acknowledged value %d of a handler that ran while a newer owner of its shard ran handlers", id, a.n)
			}
		}
	}
	// Epochs: one ownership per epoch; increasing per runner and shard.
	type key struct {
		shard sharding.ShardID
		epoch storage.Epoch
	}
	seen := map[key]string{}
	last := map[string]storage.Epoch{}
	unplanned := []time.Time{}
	for _, ev := range s.evs {
		switch e := ev.(type) {
		case runner.ShardAcquired:
			k := key{e.Shard, e.Epoch}
			if r, dup := seen[k]; dup && r != e.Runner {
				s.w.violate("shard %d acquired at epoch %d by %s and %s", e.Shard, e.Epoch, r, e.Runner)
			}
			seen[k] = e.Runner
			rk := fmt.Sprintf("%s/%d", e.Runner, e.Shard)
			if e.Epoch < last[rk] {
				s.w.violate("%s acquired shard %d at epoch %d after epoch %d", e.Runner, e.Shard, e.Epoch, last[rk])
			}
			last[rk] = e.Epoch
		case runner.ShardLost, runner.Detached:
			unplanned = append(unplanned, e.Base().Time)
		case runner.ShardReleased:
			if e.Interrupted > 0 { // busy entities released without checkpoint
				unplanned = append(unplanned, e.Time)
			}
		}
	}
	unplanned = append(unplanned, s.w.lost...) // checkpoints that failed on release
	// Counters go backwards only across an unplanned loss. An entity runs
	// one handler at a time, so its executions are ordered by their ids
	// (acknowledgements may arrive in another order).
	for id, acks := range l.acks {
		slices.SortFunc(acks, func(a, b simAck) int { return int(a.exec - b.exec) })
		for i := 1; i < len(acks); i++ {
			prev, cur := acks[i-1], acks[i]
			if cur.n > prev.n {
				continue
			}
			from, to := s.w.started[prev.exec], s.w.started[cur.exec]
			lossBetween := slices.ContainsFunc(unplanned, func(t time.Time) bool {
				return !t.Before(from) && !t.After(to)
			})
			if !lossBetween {
				s.w.violate("entity %s: acknowledged %d (%s epoch %d, ran at %v) after %d (%s epoch %d, ran at %v) with no unplanned loss between",
					id, cur.n, cur.runner, cur.epoch, to.Sub(simStart), prev.n, prev.runner, prev.epoch, from.Sub(simStart))
			}
		}
	}
	s.checkFencing()
	s.stats.asksFail = l.failed
	for _, acks := range l.acks {
		s.stats.asksOK += len(acks)
	}
}

// reportViolations fails the run with every violation the checks found.
func (s *simRun) reportViolations() {
	s.stats.violations = len(s.w.violations)
	if len(s.w.violations) > 0 && !s.opts.unfenced {
		s.t.Errorf("seed %d (replay: %s): %d violations:\n  %s\nschedule:\n  %s",
			s.seed, simReplay(s.seed), len(s.w.violations), strings.Join(s.w.violations[:min(len(s.w.violations), 10)], "\n  "), strings.Join(s.sched, "\n  "))
	}
}

// stateEpoch decodes the writer's epoch of a per-shard state record (key
// relative to its keyspace ks).
func stateEpoch(ks, key string, kv storage.KeyValue) (storage.Epoch, error) {
	kv.Key = key
	switch {
	case ks == string(storage.KeyspaceRemembered):
		r, err := storage.DecodeRemembered(kv)
		return r.Epoch, err
	case !strings.Contains(key, "/"):
		p, err := storage.DecodeProgress(kv)
		return p.Epoch, err
	default:
		r, err := storage.DecodeReminder(kv)
		return r.Epoch, err
	}
}

// TestSimulationReplayLineRunsAsPrinted: the replay command printed with a
// failure runs as printed — the test binary's flags come after the
// package (before it, go test takes them for its own and finds no Go
// files), the test pattern selects TestSimulation alone, and no cached
// result stands in for the run.
func TestSimulationReplayLineRunsAsPrinted(t *testing.T) {
	f := strings.Fields(simReplay(42))
	pkg := slices.Index(f, "./runner/")
	if len(f) < 3 || f[0] != "go" || f[1] != "test" || pkg < 0 {
		t.Fatalf("replay %q: not go test of ./runner/", f)
	}
	for i, a := range f[2:] {
		if strings.HasPrefix(a, "-sim.") && 2+i < pkg {
			t.Errorf("replay %q: %s before the package", f, a)
		}
	}
	for _, want := range []string{"-count=1", "'^TestSimulation$'", "-sim.seed=42", "-sim.log"} {
		if !slices.Contains(f, want) {
			t.Errorf("replay %q lacks %s", f, want)
		}
	}
}
