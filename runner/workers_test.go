package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// workerLog records every run of a worker: its own start and stop.
type workerLog struct {
	mu   sync.Mutex
	runs []workerRun
}

type workerRun struct {
	name       string
	runner     string
	shard      sharding.ShardID
	epoch      storage.Epoch
	start, end time.Time // end zero while it runs
	cause      error
}

// body returns a WorkerFunc that records itself and waits for its context
// (stubborn: ignores it until release is closed).
func (l *workerLog) body(release chan struct{}) runner.WorkerFunc {
	return func(ctx context.Context, w runner.Work) error {
		l.mu.Lock()
		i := len(l.runs)
		l.runs = append(l.runs, workerRun{name: w.Name, runner: w.Runner, shard: w.Shard, epoch: w.Epoch, start: time.Now()})
		l.mu.Unlock()
		<-ctx.Done()
		if release != nil {
			<-release
		}
		l.mu.Lock()
		l.runs[i].end, l.runs[i].cause = time.Now(), context.Cause(ctx)
		l.mu.Unlock()
		return nil
	}
}

// overlaps reports two runs of one name and shard (one singleton, or one
// shard's worker) alive at once on different runners.
func (l *workerLog) overlaps() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for i, a := range l.runs {
		for _, b := range l.runs[i+1:] {
			if a.name != b.name || a.shard != b.shard || a.runner == b.runner {
				continue
			}
			aEnd, bEnd := a.end, b.end
			if aEnd.IsZero() {
				aEnd = time.Now().Add(time.Hour)
			}
			if bEnd.IsZero() {
				bEnd = time.Now().Add(time.Hour)
			}
			if a.start.Before(bEnd) && b.start.Before(aEnd) {
				out = append(out, fmt.Sprintf("%s shard %d: %s [%v, %v] and %s [%v, %v]", a.name, a.shard, a.runner, a.start, a.end, b.runner, b.start, b.end))
			}
		}
	}
	return out
}

// live returns, per shard of name, the runners running it now.
func (l *workerLog) live(name string) map[sharding.ShardID][]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[sharding.ShardID][]string{}
	for _, r := range l.runs {
		if r.name == name && r.end.IsZero() {
			out[r.shard] = append(out[r.shard], r.runner)
		}
	}
	return out
}

// TestShardWorkersFollowOwnershipNeverTwoAtOnce: a shard worker runs on
// every shard its runner owns; when shards move by handoff (a join) and by
// a graceful shutdown, the old owner's worker has returned before the new
// owner's starts; after a crash the shard's worker runs again on the new
// owner. Singletons run once each, on their shard's owner.
func TestShardWorkersFollowOwnershipNeverTwoAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		rc := newReminderCluster(t, env, 8)
		var log workerLog
		start := func(id string) *started {
			cfg := rc.cfg
			cfg.ID, cfg.Transport = id, rc.net.Transport(id+":7100")
			st := rc.c.NewStore(id)
			r, err := runner.New(st, func() runner.Config { cfg.Logger = logger(t); return cfg }())
			if err != nil {
				t.Fatal(err)
			}
			if err := r.RunPerShard("follow", log.body(nil)); err != nil {
				t.Fatal(err)
			}
			for i := range 5 {
				if err := r.RunSingleton(fmt.Sprint("single-", i), log.body(nil)); err != nil {
					t.Fatal(err)
				}
			}
			s := &started{Runner: r, store: st, sub: r.Subscribe(), done: make(chan error, 1)}
			rc.rec.follow(s.sub)
			go func() { s.done <- r.Run(context.Background()) }()
			waitRunning(t, r)
			t.Cleanup(func() { r.Close(); <-s.done; s.sub.Close() })
			return s
		}
		a := start("a")
		rc.converge(a)
		waitFor(t, 5*time.Second, "a worker per shard", func() bool { return len(log.live("follow")) == 8 })
		b := start("b")
		rc.converge(a, b)
		time.Sleep(time.Second)
		c := start("c")
		rc.converge(a, b, c)
		time.Sleep(time.Second)
		sctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		if err := b.Shutdown(sctx); err != nil {
			t.Fatal(err)
		}
		cancel()
		rc.converge(a, c)
		time.Sleep(time.Second)
		c.Close()
		rc.converge(a)
		time.Sleep(time.Second)
		if o := log.overlaps(); len(o) > 0 {
			t.Fatalf("two instances at once:\n%v", o)
		}
		live := log.live("follow")
		for id := range 8 {
			if got := live[sharding.ShardID(id)]; !slices.Equal(got, []string{"a"}) {
				t.Errorf("shard %d's worker runs on %v, want [a]", id, got)
			}
		}
		for i := range 5 {
			name := fmt.Sprint("single-", i)
			l := log.live(name)
			if len(l) != 1 || !slices.Equal(l[runner.SingletonShard(name, 8)], []string{"a"}) {
				t.Errorf("singleton %s runs %v, want once on a, on shard %d", name, l, runner.SingletonShard(name, 8))
			}
		}
		// Every run ended with the cause of its end: moved or shut down
		// (planned), or with the crash.
		log.mu.Lock()
		moved := 0
		for _, r := range log.runs {
			if !r.end.IsZero() && !errors.Is(r.cause, runner.ErrShardMoved) && !errors.Is(r.cause, runner.ErrShutdown) {
				t.Errorf("a run ended with %v", r.cause)
			}
			if r.runner == "b" {
				moved++
			}
		}
		log.mu.Unlock()
		if moved == 0 {
			t.Error("no worker ever ran on b")
		}
	})
}

// TestStubbornSingletonDelaysItsHandoff: a singleton that ignores its
// cancelled context keeps its shard on its runner (the cutover is given
// up and tried again) until it returns; the new owner starts it only then.
func TestStubbornSingletonDelaysItsHandoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newAlarmEnv()
		rc := newReminderCluster(t, env, 4)
		rc.cfg.DrainTimeout = time.Second
		var log workerLog
		release := make(chan struct{})
		stubborn := true
		start := func(id string) *started {
			cfg := rc.cfg
			cfg.ID, cfg.Transport, cfg.Logger = id, rc.net.Transport(id+":7100"), logger(t)
			st := rc.c.NewStore(id)
			r, err := runner.New(st, cfg)
			if err != nil {
				t.Fatal(err)
			}
			var rel chan struct{}
			if stubborn {
				rel = release
			}
			// The singleton's shard must move to b: pick a name whose shard
			// b gets with two runners (balanced: b takes half).
			if err := r.RunSingleton("leader", log.body(rel)); err != nil {
				t.Fatal(err)
			}
			s := &started{Runner: r, store: st, sub: r.Subscribe(), done: make(chan error, 1)}
			go func() { s.done <- r.Run(context.Background()) }()
			waitRunning(t, r)
			t.Cleanup(func() { r.Close(); <-s.done; s.sub.Close() })
			return s
		}
		a := start("a")
		rc.converge(a)
		stubborn = false
		b := start("b")
		rc.converge(a, b) // needs the cutover of every shard, the singleton's included
		shard := runner.SingletonShard("leader", 4)
		_, onB := b.Owned()[shard]
		if onB {
			t.Fatalf("the singleton's shard %d moved to b while its stubborn instance still ran", shard)
		}
		t.Logf("singleton shard %d stays on a while its instance runs", shard)
		close(release)
		time.Sleep(5 * time.Second)
		if o := log.overlaps(); len(o) > 0 {
			t.Fatalf("two instances at once:\n%v", o)
		}
	})
}

// TestFailingWorkerRestartsWithBackoff: a worker that fails or panics is
// restarted after a growing back-off, never in a loop that eats a core;
// one that returns nil is done.
func TestFailingWorkerRestartsWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var starts []time.Time
		done := 0
		c := newReminderCluster(t, newAlarmEnv(), 2)
		cfg := c.cfg
		cfg.ID, cfg.Logger = "a", logger(t)
		r, err := runner.New(c.c.NewStore("a"), cfg)
		if err != nil {
			t.Fatal(err)
		}
		err = r.RunSingleton("flaky", func(ctx context.Context, w runner.Work) error {
			mu.Lock()
			starts = append(starts, time.Now())
			n := len(starts)
			mu.Unlock()
			if n%2 == 0 {
				panic("boom")
			}
			return errors.New("failed")
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.RunSingleton("once", func(ctx context.Context, w runner.Work) error { mu.Lock(); done++; mu.Unlock(); return nil }); err != nil {
			t.Fatal(err)
		}
		if err := r.RunSingleton("once", func(ctx context.Context, w runner.Work) error { return nil }); !errors.Is(err, runner.ErrDuplicateWorker) {
			t.Fatalf("a second function for one name: %v, want ErrDuplicateWorker", err)
		}
		go func() { _ = r.Run(context.Background()) }()
		t.Cleanup(r.Close)
		waitRunning(t, r)
		if err := r.RunPerShard("late", func(context.Context, runner.Work) error { return nil }); !errors.Is(err, runner.ErrAlreadyRunning) {
			t.Fatalf("RunPerShard after Run: %v, want ErrAlreadyRunning", err)
		}
		time.Sleep(20 * time.Second)
		mu.Lock()
		defer mu.Unlock()
		// 100 ms, 200, 400, ... 12.8 s: 8 restarts in 20 s.
		if len(starts) < 7 || len(starts) > 10 {
			t.Fatalf("a failing worker started %d times in 20 s", len(starts))
		}
		for i := 2; i < len(starts); i++ {
			if starts[i].Sub(starts[i-1]) < starts[i-1].Sub(starts[i-2]) {
				t.Fatalf("back-off shrank: starts %v", starts)
			}
		}
		if done != 1 {
			t.Fatalf("a worker returning nil ran %d times, want once", done)
		}
	})
}

// TestDebugPageShowsWorkersSingletonsAndRemembered: a runner's debug page
// lists the shard workers and singletons running on it (with shard, epoch
// and since when) and its remembered entities per shard.
func TestDebugPageShowsWorkersSingletonsAndRemembered(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newTwinEnv()
		rc := newReminderCluster(t, newAlarmEnv(), 4)
		cfg := rc.cfg
		cfg.ID, cfg.Transport, cfg.Logger = "a", rc.net.Transport("a:7100"), logger(t)
		r, err := runner.New(rc.c.NewStore("a"), cfg)
		if err != nil {
			t.Fatal(err)
		}
		env.register(t, r)
		wait := func(ctx context.Context, w runner.Work) error { <-ctx.Done(); return nil }
		if err := r.RunPerShard("consume", wait); err != nil {
			t.Fatal(err)
		}
		if err := r.RunSingleton("leader", wait); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		t.Cleanup(func() { r.Close(); <-done })
		waitRunning(t, r)
		if _, err := env.ping.Ask(t.Context(), r, "x", ""); err != nil {
			t.Fatal(err)
		}
		var st runner.DebugState
		waitFor(t, 10*time.Second, "the page to show 5 workers and x remembered", func() bool {
			rec := httptest.NewRecorder()
			r.DebugHandler(runner.DebugConfig{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/?format=json", nil))
			st = runner.DebugState{}
			return json.Unmarshal(rec.Body.Bytes(), &st) == nil && len(st.Workers) == 5 && len(st.Remembered) == 1
		})
		leader := runner.SingletonShard("leader", 4)
		for i, w := range st.Workers {
			switch {
			case i == 0 && (w.Name != "consume" || w.Singleton || w.Shard != 0):
				t.Errorf("first worker %+v, want consume on shard 0", w)
			case i == 4 && (w.Name != "leader" || !w.Singleton || w.Shard != leader):
				t.Errorf("last worker %+v, want the singleton leader on shard %d", w, leader)
			case w.Epoch == 0 || w.Since.IsZero():
				t.Errorf("worker %+v without epoch or start", w)
			}
		}
		if want := sharding.ShardOf("x", 4); st.Remembered[0].Shard != want || st.Remembered[0].Count != 1 {
			t.Errorf("remembered %+v, want 1 on shard %d", st.Remembered, want)
		}
		rec := httptest.NewRecorder()
		r.DebugHandler(runner.DebugConfig{}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if body := rec.Body.String(); !strings.Contains(body, `id="workers"`) || !strings.Contains(body, "singleton") {
			t.Error("the HTML page has no workers table")
		}
	})
}

// TestHandlersFinishBeforeTheirShardWorkersStop: a drain (here a graceful
// shutdown) lets the handlers running finish while the shard's workers
// still run — a handler may wait for what a worker produces — and only
// then cancels the workers.
func TestHandlersFinishBeforeTheirShardWorkersStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		feed := make(chan string)
		kind := entity.NewKind("reader", func(string) *struct{} { return &struct{}{} })
		read := entity.Method(kind, "Read", func(_ *struct{}, ctx context.Context, _ string) (string, error) {
			select {
			case v := <-feed:
				return v, nil
			case <-ctx.Done():
				return "", context.Cause(ctx)
			}
		})
		rc := newReminderCluster(t, newAlarmEnv(), 1)
		cfg := rc.cfg
		cfg.ID, cfg.Transport, cfg.Logger, cfg.DrainTimeout = "a", rc.net.Transport("a:7100"), logger(t), 10*time.Second
		r, err := runner.New(rc.c.NewStore("a"), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(kind); err != nil {
			t.Fatal(err)
		}
		var stopped time.Time
		if err := r.RunPerShard("producer", func(ctx context.Context, w runner.Work) error {
			defer func() { stopped = time.Now() }()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Second):
				}
				select {
				case <-ctx.Done():
					return nil
				case feed <- "record":
				}
			}
		}); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		t.Cleanup(func() { r.Close(); <-done })
		waitRunning(t, r)
		rc.converge(&started{Runner: r})
		got := make(chan error, 1)
		var answered time.Time
		go func() {
			_, err := read.Ask(t.Context(), r, "x", "")
			answered = time.Now()
			got <- err
		}()
		time.Sleep(100 * time.Millisecond) // the read waits for the producer
		sctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		if err := r.Shutdown(sctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatalf("a read in flight at the shutdown failed: %v", err)
		}
		if stopped.IsZero() || stopped.Before(answered) {
			t.Fatalf("the worker stopped at %v, before the read it fed answered at %v", stopped, answered)
		}
	})
}

// TestSingletonRecordWrittenOnceTheStoreAnswers: a singleton's record
// (singletons/{shard}/{name}, where operators see it run) whose write
// failed because the store was too slow is written once the store
// answers again, while the singleton runs there.
func TestSingletonRecordWrittenOnceTheStoreAnswers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		s := c.NewStore("a")
		// Shard state calls (the record's write among them) answer after
		// 1 s, past the record write's bound; the runner's own reads of
		// shard states still fit their OpTimeout.
		s.Delay(memory.OpShardState, time.Second)
		rec := newRecorder(t)
		r, err := runner.New(s, runner.Config{ID: "a", NumShards: 4, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.RunSingleton("leader", func(ctx context.Context, w runner.Work) error { <-ctx.Done(); return nil }); err != nil {
			t.Fatal(err)
		}
		sub := r.Subscribe()
		rec.follow(sub)
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		t.Cleanup(func() { r.Close(); <-done; sub.Close() })
		records := func() int {
			snap, err := c.NewStore("observer").List(t.Context(), storage.KeyspaceSingletons)
			if err != nil {
				t.Fatal(err)
			}
			return len(snap.KVs)
		}
		waitFor(t, time.Minute, "the singleton started", func() bool {
			return slices.ContainsFunc(rec.all(), func(ev runner.Event) bool {
				w, ok := ev.(runner.WorkerStarted)
				return ok && w.Name == "leader"
			})
		})
		time.Sleep(10 * time.Second)
		if n := records(); n != 0 {
			t.Fatalf("%d singleton records written through a store slower than the write's bound", n)
		}
		s.Delay(memory.OpShardState, 0)
		waitFor(t, 10*time.Second, "the singleton's record once the store answers", func() bool { return records() == 1 })
	})
}
