package runner_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// The simulation's always-on work: every runner registers simSingletons
// singletons and a shard worker, each recording its own runs (start and
// return), and a remembered kind whose simRemembered entities are
// activated once, before the faults, and record their own lives (from
// Activate to Release or the end of the shard's context; half of them are
// remembered without a message, by Runner.Remember). After the run
// the checks demand:
//
//   - no two runs of one singleton, or of one shard's worker, on
//     different runners at once, and every run inside its runner's
//     ownership of the shard at the run's epoch (from the runners' own
//     events);
//   - no two lives of one remembered entity on different runners at once;
//   - once the cluster converged, every singleton and every shard's worker
//     runs exactly once, on the owner of its shard, and every remembered
//     entity lives exactly once, on the owner of its shard, though no
//     message reached it since the faults began.
type simAlways struct {
	mu    sync.Mutex
	runs  []simRun2
	lives []simRun2
	// late are the entities remembered through a runner right before its
	// graceful stop (rememberBeforeStop); tried counts the attempts.
	late  []simLate
	tried int
	kind  *entity.Kind[simKeeper]
	touch *entity.MethodRef[simKeeper, string, simServed]
}

// simRun2 is one run of a worker or one life of an entity.
type simRun2 struct {
	name       string // worker name or entity ID
	runner     string
	shard      sharding.ShardID
	epoch      storage.Epoch
	start, end time.Time // end zero while it runs
}

// simServed says which ownership answered a touch.
type simServed struct {
	Runner string
	Epoch  storage.Epoch
}

// simLate is an entity remembered by its first message at at, right
// before runner's graceful stop, answered by the ownership served of its
// shard.
type simLate struct {
	id     string
	runner string
	shard  sharding.ShardID
	served simServed
	at     time.Time
}

const (
	simSingletons = 3
	simRemembered = 6
)

type simKeeper struct {
	a    *simAlways
	id   string
	life int
}

func newSimAlways() *simAlways {
	a := &simAlways{}
	a.kind = entity.NewKind("keeper", func(id string) *simKeeper { return &simKeeper{a: a, id: id} }, entity.Remembered(), entity.IdleAfter(time.Second))
	a.touch = entity.Method(a.kind, "touch", func(_ *simKeeper, ctx context.Context, _ string) (simServed, error) {
		info, _ := runner.ShardInfoFrom(ctx)
		return simServed{Runner: info.Runner, Epoch: info.Epoch}, nil
	})
	return a
}

func (k *simKeeper) Activate(ctx context.Context, info entity.ActivateInfo) error {
	si, _ := runner.ShardInfoFrom(ctx)
	k.life = k.a.begin(&k.a.lives, simRun2{name: k.id, runner: si.Runner, shard: info.Shard, epoch: storage.Epoch(info.Epoch)})
	go func(i int) { <-ctx.Done(); k.a.end(&k.a.lives, i) }(k.life)
	return nil
}

func (k *simKeeper) Release(context.Context, entity.ReleaseInfo) error {
	k.a.end(&k.a.lives, k.life)
	return nil
}

func (a *simAlways) begin(list *[]simRun2, r simRun2) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	r.start = time.Now()
	*list = append(*list, r)
	return len(*list) - 1
}

func (a *simAlways) end(list *[]simRun2, i int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if (*list)[i].end.IsZero() {
		(*list)[i].end = time.Now()
	}
}

// worker records a run until its context ends.
func (a *simAlways) worker(ctx context.Context, w runner.Work) error {
	i := a.begin(&a.runs, simRun2{name: w.Name, runner: w.Runner, shard: w.Shard, epoch: w.Epoch})
	<-ctx.Done()
	a.end(&a.runs, i)
	return nil
}

// install registers the kind, the singletons and the shard worker on r.
func (a *simAlways) install(r *runner.Runner) error {
	if err := r.Register(a.kind); err != nil {
		return err
	}
	if err := r.RunPerShard("worker", a.worker); err != nil {
		return err
	}
	for i := range simSingletons {
		if err := r.RunSingleton(fmt.Sprint("singleton-", i), a.worker); err != nil {
			return err
		}
	}
	return nil
}

// activate makes the remembered entities remembered through the gateway,
// before the faults: the even ones by a message (their first activation),
// the odd ones without any (Runner.Remember).
func (s *simRun) activateRemembered(gw *simNode) {
	a := s.w.always
	for i := range simRemembered {
		id := fmt.Sprintf("k%d", i)
		for attempt := 0; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			var err error
			if i%2 == 0 {
				_, err = a.touch.Ask(ctx, gw.r, id, "")
			} else {
				err = gw.r.Remember(ctx, a.kind, id)
			}
			cancel()
			if err == nil {
				break
			}
			if attempt == 20 {
				s.w.violate("activating remembered entity %s failed before any fault: %v", id, err)
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// rememberBeforeStop activates, through n, a fresh remembered entity of a
// shard n owns, right before n's graceful stop: its marker's put is then
// still queued, and the release must write it so that the next owner
// activates it (checkAlwaysLive).
func (s *simRun) rememberBeforeStop(n *simNode) {
	owned := n.r.Owned()
	if len(owned) == 0 {
		return
	}
	a := s.w.always
	a.mu.Lock()
	seq := a.tried
	a.tried++
	a.mu.Unlock()
	for j := range 1000 {
		id := fmt.Sprintf("late%d-%d", seq, j)
		shard := sharding.ShardOf(id, simShards)
		if _, ok := owned[shard]; !ok {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		served, err := a.touch.Ask(ctx, n.r, id, "")
		cancel()
		if err == nil {
			a.mu.Lock()
			a.late = append(a.late, simLate{id: id, runner: n.id, shard: shard, served: served, at: time.Now()})
			a.mu.Unlock()
		}
		return
	}
}

// checkAlwaysLive checks, on the converged cluster (before it stops), that
// every singleton, shard worker and remembered entity runs exactly once,
// on its shard's owner.
func (s *simRun) checkAlwaysLive() {
	owner := make([]string, simShards)
	for _, n := range s.live() {
		for id := range n.r.Owned() {
			owner[id] = n.id
		}
	}
	a := s.w.always
	a.mu.Lock()
	defer a.mu.Unlock()
	liveOn := func(list []simRun2, name string, shard sharding.ShardID) []string {
		var out []string
		for _, r := range list {
			if r.name == name && r.shard == shard && r.end.IsZero() {
				out = append(out, r.runner)
			}
		}
		return out
	}
	for i := range simSingletons {
		name := fmt.Sprint("singleton-", i)
		shard := runner.SingletonShard(name, simShards)
		if got := liveOn(a.runs, name, shard); !slices.Equal(got, []string{owner[shard]}) {
			s.w.violate("singleton %s runs on %v once the cluster converged, want once on %s, the owner of shard %d", name, got, owner[shard], shard)
		}
	}
	for shard := range sharding.ShardID(simShards) {
		if got := liveOn(a.runs, "worker", shard); !slices.Equal(got, []string{owner[shard]}) {
			s.w.violate("shard %d's worker runs on %v once the cluster converged, want once on %s", shard, got, owner[shard])
		}
	}
	for i := range simRemembered {
		id := fmt.Sprintf("k%d", i)
		shard := sharding.ShardOf(id, simShards)
		if got := liveOn(a.lives, id, shard); !slices.Equal(got, []string{owner[shard]}) {
			s.w.violate("remembered entity %s lives on %v once the cluster converged, want once on %s, the owner of shard %d", id, got, owner[shard], shard)
		}
	}
	// An entity remembered right before its runner's graceful stop lives
	// on its shard's owner, unless the ownership that answered its touch
	// ended otherwise than by a release (a marker not written yet is then
	// lost with it).
	for _, l := range a.late {
		if s.lostUnreleased(l) {
			s.stats.lateExcused++
			continue
		}
		s.stats.lateRemembered++
		if got := liveOn(a.lives, l.id, l.shard); !slices.Equal(got, []string{owner[l.shard]}) {
			s.w.violate("remembered entity %s, activated on %s at %v right before its graceful stop, lives on %v once the cluster converged, want once on %s, the owner of shard %d",
				l.id, l.runner, l.at.Sub(simStart), got, owner[l.shard], l.shard)
		}
	}
}

// lostUnreleased reports whether the ownership that answered l's touch
// was lost, its runner detached while it lasted, or its release could
// not record the progress and markers (RemindersUnrecorded).
func (s *simRun) lostUnreleased(l simLate) bool {
	s.evMu.Lock()
	defer s.evMu.Unlock()
	held := false // the ownership began and has not ended yet
	for _, ev := range s.evs {
		switch e := ev.(type) {
		case runner.ShardAcquired:
			if e.Runner == l.served.Runner && e.Shard == l.shard && e.Epoch == l.served.Epoch {
				held = true
			}
		case runner.ShardReleased:
			if e.Runner == l.served.Runner && e.Shard == l.shard && e.Epoch == l.served.Epoch {
				held = false
			}
		case runner.ShardLost:
			if e.Runner == l.served.Runner && e.Shard == l.shard && e.Epoch == l.served.Epoch {
				return true
			}
		case runner.RemindersUnrecorded:
			if e.Runner == l.served.Runner && e.Shard == l.shard && e.Epoch == l.served.Epoch {
				return true
			}
		case runner.Detached:
			if e.Runner == l.served.Runner && held {
				return true
			}
		}
	}
	return false
}

// checkAlways checks the recorded runs and lives against each other and
// the runners' ownerships (after the run).
func (s *simRun) checkAlways() {
	from, _ := s.ownerships()
	a := s.w.always
	a.mu.Lock()
	defer a.mu.Unlock()
	overlaps := func(what string, list []simRun2) {
		for i, x := range list {
			for _, y := range list[i+1:] {
				if x.name != y.name || x.shard != y.shard || x.runner == y.runner {
					continue
				}
				if x.start.Before(y.end) && y.start.Before(x.end) {
					s.w.violate("%s %s of shard %d on %s [%v, %v] and on %s [%v, %v] at once", what, x.name, x.shard,
						x.runner, x.start.Sub(simStart), x.end.Sub(simStart), y.runner, y.start.Sub(simStart), y.end.Sub(simStart))
				}
			}
		}
	}
	overlaps("worker", a.runs)
	overlaps("remembered entity", a.lives)
	for _, r := range a.runs {
		start, owned := from[simOwner{r.runner, r.shard, r.epoch}]
		if !owned || r.start.Before(start) {
			s.w.violate("worker %s started on %s at %v under epoch %d of shard %d, outside that ownership", r.name, r.runner, r.start.Sub(simStart), r.epoch, r.shard)
		}
	}
	s.stats.workerRuns += len(a.runs)
	s.stats.rememberedLives += len(a.lives)
}

// simOwner is one ownership of a shard: a runner at an epoch.
type simOwner struct {
	runner string
	shard  sharding.ShardID
	epoch  storage.Epoch
}

// ownerships returns, from the runners' events, when each ownership began
// (its first ShardAcquired) and when it ended (its last ShardReleased or
// ShardLost, unless a later ShardAcquired reopened it: a cutover given up).
func (s *simRun) ownerships() (from, until map[simOwner]time.Time) {
	from, until = map[simOwner]time.Time{}, map[simOwner]time.Time{}
	for _, ev := range s.evs {
		switch e := ev.(type) {
		case runner.ShardAcquired:
			k := simOwner{e.Runner, e.Shard, e.Epoch}
			if _, ok := from[k]; !ok {
				from[k] = e.Time
			}
			delete(until, k)
		case runner.ShardReleased:
			until[simOwner{e.Runner, e.Shard, e.Epoch}] = e.Time
		case runner.ShardLost:
			until[simOwner{e.Runner, e.Shard, e.Epoch}] = e.Time
		}
	}
	return from, until
}
