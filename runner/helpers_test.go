package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/runner/runnertest/ownership"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
)

// recorder collects the events of several runners in one order.
type recorder struct {
	mu     sync.Mutex
	events []runner.Event
	wg     sync.WaitGroup
}

func (rec *recorder) follow(sub *runner.Subscription) {
	rec.wg.Go(func() {
		for ev := range sub.Events() {
			rec.mu.Lock()
			rec.events = append(rec.events, ev)
			rec.mu.Unlock()
		}
	})
}

func (rec *recorder) all() []runner.Event {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := slices.Clone(rec.events)
	slices.SortStableFunc(out, func(a, b runner.Event) int { return a.Base().Time.Compare(b.Base().Time) })
	return out
}

// newRecorder returns a recorder whose test, when it fails, prints the
// last events of every runner it followed (and the replay command).
func newRecorder(t testing.TB) *recorder {
	rec := &recorder{}
	testenv.OnFailure(t, func() string { return ownership.LastEvents(rec.all(), lastEventsShown) })
	return rec
}

// lastEventsShown is how many of each runner's last events a failed test
// prints.
const lastEventsShown = 15

// started is a running runner in a test.
type started struct {
	*runner.Runner
	store *memory.Store
	sub   *runner.Subscription
	done  chan error
}

func logger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// start runs a runner on a new client of cluster. Its events go to rec (if
// not nil). Cleanup closes it.
func start(t *testing.T, c *memory.Cluster, rec *recorder, cfg runner.Config) *started {
	t.Helper()
	return startOn(t, c.NewStore(cfg.ID), rec, cfg)
}

// startOn is start on a given client (with its faults already set).
func startOn(t *testing.T, s *memory.Store, rec *recorder, cfg runner.Config) *started {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = logger(t)
	}
	r, err := runner.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := &started{Runner: r, store: s, sub: r.Subscribe(), done: make(chan error, 1)}
	if rec != nil {
		rec.follow(st.sub)
	}
	go func() { st.done <- r.Run(context.Background()) }()
	waitRunning(t, r)
	t.Cleanup(func() {
		r.Close()
		<-st.done
		st.sub.Close()
	})
	return st
}

// waitRunning waits until Run has been called on r (a send made before
// that waits for Run, at most runCallGrace). It yields rather than sleeps, so that inside a
// synctest bubble no fake time passes.
func waitRunning(t testing.TB, r *runner.Runner) {
	t.Helper()
	for r.Status().Phase == "new" {
		runtime.Gosched()
	}
}

// waitFor polls cond every 10ms (real time, or fake time inside synctest)
// until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, d, what, cond)
}

// partitionOK reports whether the runners own an exact partition of n
// shards that matches assignment a.
func partitionOK(rs []*started, n int) (bool, string) {
	owner := make([]string, n)
	for _, r := range rs {
		for id := range r.Owned() {
			if owner[id] != "" {
				return false, "shard " + id.String() + " owned by " + owner[id] + " and " + r.ID()
			}
			owner[id] = r.ID()
		}
	}
	a := rs[0].Assignment()
	if len(a) != n {
		return false, "no assignment yet"
	}
	counts := a.Counts()
	for _, r := range rs {
		if !slices.Equal(r.Assignment(), a) {
			return false, "runners disagree on the assignment"
		}
		if r.Config().Weight > 0 && counts[r.ID()] == 0 {
			return false, "the assignment leaves out " + r.ID()
		}
	}
	for id := range n {
		if owner[id] == "" || owner[id] != a[id] {
			return false, "shard " + sharding.ShardID(id).String() + " owned by " + owner[id] + ", assigned to " + a[id]
		}
	}
	return true, ""
}

// idFor returns an entity ID of shard s (of n).
func idFor(s sharding.ShardID, n int, prefix string) string {
	for i := 0; ; i++ {
		id := fmt.Sprintf("%s%d", prefix, i)
		if sharding.ShardOf(id, n) == s {
			return id
		}
	}
}

// who reports where it runs; it counts concurrent handlers per entity
// across all runners.
type who struct {
	id  string
	n   int64
	env *whoEnv
}

type whoEnv struct {
	mu      sync.Mutex
	active  map[string]int
	overlap []string
}

type whoReq struct {
	Sleep    time.Duration
	IgnoreCt bool
}
type whoResp struct {
	Runner string
	N      int64
}

func (w *who) Do(ctx context.Context, r whoReq) (whoResp, error) {
	info, _ := runner.ShardInfoFrom(ctx)
	w.env.mu.Lock()
	w.env.active[w.id]++
	if w.env.active[w.id] > 1 {
		w.env.overlap = append(w.env.overlap, fmt.Sprintf("%s: second concurrent handler on %s", w.id, info.Runner))
	}
	w.env.mu.Unlock()
	defer func() {
		w.env.mu.Lock()
		w.env.active[w.id]--
		w.env.mu.Unlock()
	}()
	if r.Sleep > 0 {
		if r.IgnoreCt {
			time.Sleep(r.Sleep)
		} else {
			select {
			case <-time.After(r.Sleep):
			case <-ctx.Done():
			}
		}
	}
	w.n++
	return whoResp{Runner: info.Runner, N: w.n}, nil
}

func newWho() (*whoEnv, *entity.Kind[who], *entity.MethodRef[who, whoReq, whoResp]) {
	env := &whoEnv{active: map[string]int{}}
	k := entity.NewKind("who", func(id string) *who { return &who{id: id, env: env} })
	return env, k, entity.Method(k, "do", (*who).Do)
}
