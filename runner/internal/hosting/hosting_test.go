package hosting

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testEnv is the runner as hosting sees it: the detach instant can be
// made to pass at will; reads counts the clock readings (PastDetach).
type testEnv struct {
	past  atomic.Bool
	reads atomic.Int64
}

func (e *testEnv) PastDetach() bool {
	e.reads.Add(1)
	return e.past.Load()
}

func (e *testEnv) NotHere(id sharding.ShardID) error { return &NotOwnerError{Shard: id} }

// worker is an entity whose handler blocks until released when asked to.
type worker struct {
	reasons  []entity.ActivateReason
	released chan error // Release reasons, when set by the test
	relGate  chan struct{}
}

type workReq struct{ Block bool }

var (
	gate     = make(chan struct{}) // replaced per test under gateMu
	gateMu   sync.Mutex
	started  = make(chan struct{}, 16)
	workKind = entity.NewKind("worker", func(string) *worker { return &worker{} })
	_        = entity.Method(workKind, "work", func(w *worker, ctx context.Context, r workReq) (int, error) {
		if r.Block {
			blockAtGate()
		}
		return len(w.reasons), nil
	})
)

func (w *worker) Activate(_ context.Context, info entity.ActivateInfo) error {
	w.reasons = append(w.reasons, info.Reason)
	return nil
}

func (w *worker) Release(_ context.Context, info entity.ReleaseInfo) error {
	if w.relGate != nil {
		<-w.relGate
	}
	if w.released != nil {
		w.released <- info.Reason
	}
	return nil
}

// newGate returns a fresh gate for blocking handlers and its release.
// blockAtGate says the handler started, then waits for the test's gate
// (newGate) to open.
func blockAtGate() {
	gateMu.Lock()
	g := gate
	gateMu.Unlock()
	started <- struct{}{}
	<-g
}

func newGate(t *testing.T) func() {
	t.Helper()
	gateMu.Lock()
	gate = make(chan struct{})
	g := gate
	gateMu.Unlock()
	var once sync.Once
	open := func() { once.Do(func() { close(g) }) }
	t.Cleanup(open)
	return open
}

func testMetrics(t *testing.T) *Metrics {
	t.Helper()
	m, err := NewMetrics(noop.NewMeterProvider().Meter("test"), metric.WithAttributes())
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type fixture struct {
	env    *testEnv
	host   *Host
	shard  *Shard
	cancel context.CancelCauseFunc
	kind   *Kind
	work   *entity.Handler
}

func newFixture(t *testing.T, maxResident int) *fixture {
	t.Helper()
	f := &fixture{env: &testEnv{}}
	f.host = New(Config{RunnerID: "r1", NumShards: 4, DrainTimeout: 5 * time.Second, CutoverWaiters: 4,
		MaxResidentEntities: maxResident, PassivationInterval: time.Hour}, f.env, memory.New(), testMetrics(t),
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := f.host.Register(workKind); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	f.cancel = cancel
	t.Cleanup(func() { cancel(ErrShutdown) })
	f.shard = f.host.NewShard(ShardSpec{ID: 1, Epoch: 7, Ctx: ctx, Attachment: context.Background(), Reason: entity.ActivateNew})
	f.host.Install(f.shard)
	f.kind = f.host.Kind("worker")
	f.work, _ = f.kind.Desc.Handler("work")
	return f
}

func (f *fixture) ask(id string, block bool) Result {
	return f.shard.Deliver(context.Background(), f.kind, f.work, id, workReq{Block: block}, false, false, false)
}

// askAsync sends an ask whose handler blocks at the gate and waits until
// it runs.
func (f *fixture) askAsync(t *testing.T, id string) <-chan Result {
	t.Helper()
	out := make(chan Result, 1)
	go func() { out <- f.ask(id, true) }()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the blocking handler never started")
	}
	return out
}

func wait[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func TestNoHandlerStartsAfterTheDetachInstant(t *testing.T) {
	f := newFixture(t, 0)
	f.env.past.Store(true)
	res := f.ask("a", false)
	if !res.Undelivered || !errors.Is(res.Err, ErrDetached) || res.Epoch != 0 {
		t.Fatalf("ask after the detach instant = %+v, want undelivered ErrDetached, no epoch (no handler ran)", res)
	}
	f.env.past.Store(false)
	if res := f.ask("a", false); res.Err != nil || res.V != 1 || res.Epoch != 7 {
		t.Fatalf("ask before the detach instant = %+v, want 1 activation at epoch 7", res)
	}
}

func TestResultOfAHandlerThatOutlivedTheDetachInstantIsWithheld(t *testing.T) {
	f := newFixture(t, 0)
	open := newGate(t)
	out := f.askAsync(t, "a")
	f.env.past.Store(true) // a pause outlived the detach instant while the handler ran
	open()
	res := wait(t, out, "the ask")
	var stale *StaleResultError
	if !errors.As(res.Err, &stale) || !errors.Is(res.Err, ErrMaybeDelivered) || !errors.Is(res.Err, ErrDetached) || res.Undelivered || res.V != nil {
		t.Fatalf("late result = %+v, want a withheld *StaleResultError (ErrMaybeDelivered, ErrDetached)", res)
	}
	if stale.Runner != "r1" || stale.Epoch != 7 || stale.Shard != 1 {
		t.Errorf("StaleResultError = %+v, want runner r1, shard 1, epoch 7", stale)
	}
	// The instance, which may hold that result, was discarded.
	f.env.past.Store(false)
	newGate(t)()
	if res := f.ask("a", false); res.Err != nil || res.V != 1 {
		t.Fatalf("next ask = %+v, want a fresh instance (1 activation)", res)
	}
}

func TestMessagesQueuedBehindAHandlerThatOutlivedTheDetachInstantNeverRun(t *testing.T) {
	f := newFixture(t, 0)
	open := newGate(t)
	first := f.askAsync(t, "a")
	queued := make(chan Result, 2)
	for range 2 {
		go func() { queued <- f.ask("a", false) }()
	}
	waitQueued(t, f, "a", 2) // one batch: the two asks run right after the first
	f.env.past.Store(true)
	open()
	if res := wait(t, first, "the running ask"); !errors.Is(res.Err, ErrMaybeDelivered) {
		t.Fatalf("the ask that outlived the detach instant = %+v, want its result withheld", res)
	}
	for range 2 {
		if res := wait(t, queued, "a queued ask"); !res.Undelivered || !errors.Is(res.Err, ErrDetached) || res.Epoch != 0 {
			t.Fatalf("an ask queued behind it = %+v, want undelivered ErrDetached, no epoch (no handler ran)", res)
		}
	}
}

func TestResultOfAHandlerWhoseShardLeftIsWithheldUnlessItsLockIsKept(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(map[bool]string{false: "dropped", true: "lock kept"}[keep], func(t *testing.T) {
			f := newFixture(t, 0)
			open := newGate(t)
			out := f.askAsync(t, "a")
			if keep {
				f.shard.KeepLock()
			}
			f.host.Uninstall(f.shard)
			f.shard.Close()
			f.cancel(ErrShardMoved)
			open()
			res := wait(t, out, "the ask")
			if keep {
				if res.Err != nil || res.V != 1 {
					t.Fatalf("result with the lock kept = %+v, want it acknowledged", res)
				}
				return
			}
			if !errors.Is(res.Err, ErrMaybeDelivered) || !errors.Is(res.Err, ErrShardMoved) {
				t.Fatalf("result after the shard left = %+v, want a withheld result caused by ErrShardMoved", res)
			}
		})
	}
}

func TestDrainWaitsUntilRemoteAnswersAreWritten(t *testing.T) {
	f := newFixture(t, 0)
	res := f.shard.Deliver(context.Background(), f.kind, f.work, "a", workReq{}, false, true, false) // remote
	if res.Err != nil || !res.Admitted {
		t.Fatal(res)
	}
	drained := make(chan struct{})
	go func() { f.shard.Drain(context.Background(), ErrShardMoved); close(drained) }()
	select {
	case <-drained:
		t.Fatal("the drain ended before the remote answer was written")
	case <-time.After(200 * time.Millisecond):
	}
	f.shard.ReplyWritten()
	wait(t, drained, "the drain after the answer was written")
}

func TestCutoverSendsQueuedAsksBackAndHoldsNewSenders(t *testing.T) {
	f := newFixture(t, 0)
	open := newGate(t)
	first := f.askAsync(t, "a")
	queued := make(chan Result, 1)
	go func() { queued <- f.ask("a", false) }()
	waitQueued(t, f, "a", 1)
	f.shard.BeginCutover("r2")
	open()
	if res := wait(t, first, "the running ask"); res.Err != nil {
		t.Fatalf("the ask running at the cutover = %+v, want its result", res)
	}
	if res := wait(t, queued, "the queued ask"); !res.Undelivered || !errors.Is(res.Err, ErrShardMoved) {
		t.Fatalf("the ask queued at the cutover = %+v, want undelivered ErrShardMoved (retried at the new owner)", res)
	}
	held := make(chan Result, 1)
	go func() { held <- f.ask("b", false) }()
	select {
	case res := <-held:
		t.Fatalf("a new sender during the cutover got %+v, want it held", res)
	case <-time.After(200 * time.Millisecond):
	}
	f.shard.Reopen() // the handoff failed: hosting resumes
	if res := wait(t, held, "the held ask"); res.Err != nil {
		t.Fatalf("held ask after Reopen = %+v, want it run here", res)
	}
}

// waitQueued waits until entity id has n messages queued.
func waitQueued(t *testing.T, f *fixture, id string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		f.shard.mu.RLock()
		e := f.shard.entities.get(f.kind, id)
		f.shard.mu.RUnlock()
		if e != nil {
			e.mu.Lock()
			q := int(e.n)
			e.mu.Unlock()
			if q >= n {
				return
			}
		}
	}
	t.Fatalf("%s never had %d queued messages", id, n)
}

func TestNewInstanceWaitsForThePreviousReleaseHook(t *testing.T) {
	f := newFixture(t, 0)
	if res := f.ask("a", false); res.Err != nil {
		t.Fatal(res)
	}
	f.shard.mu.RLock()
	e := f.shard.entities.get(f.kind, "a")
	f.shard.mu.RUnlock()
	w := e.inst.(*worker)
	w.relGate, w.released = make(chan struct{}), make(chan error, 1)
	// The answer reaches the asker before the entity's goroutine marks
	// it idle: retire refuses a busy entity.
	waitIdleEntity(t, e)
	retired := make(chan bool, 1)
	go func() { retired <- f.shard.retire(e, ErrPassivated) }()
	next := make(chan Result, 1)
	go func() {
		waitRetiring(t, f, "a")
		next <- f.ask("a", false)
	}()
	select {
	case res := <-next:
		t.Fatalf("a new instance answered %+v while the previous one's Release hook ran", res)
	case <-time.After(200 * time.Millisecond):
	}
	close(w.relGate)
	if reason := wait(t, w.released, "the Release hook"); !errors.Is(reason, ErrPassivated) {
		t.Errorf("Release reason = %v, want ErrPassivated", reason)
	}
	if !wait(t, retired, "retire") {
		t.Error("retire reported the idle entity busy")
	}
	if res := wait(t, next, "the next ask"); res.Err != nil || res.V != 1 {
		t.Fatalf("ask after the passivation = %+v, want a new instance", res)
	}
}

func waitRetiring(t *testing.T, f *fixture, id string) {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		f.shard.mu.RLock()
		_, ok := f.shard.retiring[EntityKey{Kind: "worker", ID: id}]
		f.shard.mu.RUnlock()
		if ok {
			return
		}
	}
	t.Errorf("%s never started retiring", id)
}

func TestResidentCapPassivatesTheLeastRecentlyUsed(t *testing.T) {
	f := newFixture(t, 2)
	f.askInOrder(t, "a", "b", "c")
	f.host.residents.evict()
	if n := f.host.EntityCount(); n != 2 {
		t.Fatalf("%d resident entities after eviction, want the cap (2)", n)
	}
	hot := f.host.Hot(1, 10)
	if len(hot) != 2 || hot[0].ID != "c" || hot[1].ID != "b" {
		t.Fatalf("resident entities, most recent first = %v, want c, b (a evicted)", hot)
	}
}

// TestRememberedEntitiesStayResidentAndWarmFirst: the resident cap and
// idle passivation skip remembered entities, and a handoff's hot set lists
// them first.
func TestRememberedEntitiesStayResidentAndWarmFirst(t *testing.T) {
	f := newFixture(t, 2)
	pinned := entity.NewKind("pinned", func(string) *struct{} { return &struct{}{} }, entity.Remembered(), entity.IdleAfter(time.Nanosecond))
	touch := entity.Method(pinned, "touch", func(*struct{}, context.Context, int) (int, error) { return 1, nil })
	if err := f.host.Register(pinned); err != nil {
		t.Fatal(err)
	}
	pk := f.host.Kind("pinned")
	h, _ := pk.Desc.Handler(touch.Name())
	if res := f.shard.Deliver(context.Background(), pk, h, "p", 0, false, false, false); res.Err != nil {
		t.Fatal(res.Err)
	}
	f.askInOrder(t, "a", "b", "c")
	f.host.residents.evict()
	if n := f.host.EntityCount(); n != 2 {
		t.Fatalf("%d resident entities after eviction, want the cap (2)", n)
	}
	hot := f.host.Hot(1, 10)
	if len(hot) != 2 || hot[0].ID != "p" || hot[1].ID != "c" {
		t.Fatalf("hot set %v, want p (remembered) then c", hot)
	}
	f.host.residents.passivateIdle(time.Now().Add(time.Hour))
	if hot := f.host.Hot(1, 10); len(hot) != 1 || hot[0].ID != "p" {
		t.Fatalf("after idle passivation %v, want only p", hot)
	}
}

// askInOrder asks entities ids one after the other, each once its
// predecessor's goroutine exited: the answer comes before the goroutine
// exits and marks its entity used (LRU), so the use order is ids' order.
func (f *fixture) askInOrder(t *testing.T, ids ...string) {
	t.Helper()
	for _, id := range ids {
		if res := f.ask(id, false); res.Err != nil {
			t.Fatal(res)
		}
		for deadline := time.Now().Add(10 * time.Second); f.shard.Running() > 0; time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s's goroutine never exited", id)
			}
		}
	}
}

// TestAsksQueuedBehindARemoteAskRunningOnItsSenderRunAfterIt: a remote
// ask that finds its entity idle runs on its sender's goroutine (the
// transport's); messages arriving meanwhile wait for it (one handler at a
// time), then run on the entity's own goroutine — the first ask's answer
// does not wait for them — and are all answered, and the entity counts as
// running throughout (a drain waits for it).
func TestAsksQueuedBehindARemoteAskRunningOnItsSenderRunAfterIt(t *testing.T) {
	f := newFixture(t, 0)
	open := newGate(t)
	remoteAsk := func() Result {
		return f.shard.Deliver(context.Background(), f.kind, f.work, "a", workReq{Block: true}, false, true, false)
	}
	first := make(chan Result, 1)
	go func() { first <- remoteAsk() }()
	wait(t, started, "the first remote ask's handler")
	if n := f.shard.Running(); n != 1 {
		t.Fatalf("running = %d while a remote ask runs on its sender, want 1", n)
	}
	later := make(chan Result, 3)
	go func() { later <- f.ask("a", true) }()
	go func() { later <- remoteAsk() }()
	go func() { later <- f.ask("a", true) }()
	waitQueued(t, f, "a", 3)
	select {
	case <-started:
		t.Fatal("a queued ask started while the remote ask ran")
	case <-time.After(100 * time.Millisecond):
	}
	openLater := newGate(t) // the queued asks block at a new gate
	open()
	// Its answer does not wait for the asks queued behind it.
	if res := wait(t, first, "the first remote ask"); res.Err != nil || !res.Admitted {
		t.Fatalf("first remote ask = %+v, want its result", res)
	}
	openLater()
	for i := range 3 {
		wait(t, started, "a queued ask's handler")
		if res := wait(t, later, "a queued ask"); res.Err != nil {
			t.Fatalf("queued ask %d = %+v, want its result", i, res)
		}
	}
	for range 2 { // the remote asks' answers
		f.shard.ReplyWritten()
	}
	drained := make(chan struct{})
	go func() { f.shard.Drain(context.Background(), ErrShardMoved); close(drained) }()
	wait(t, drained, "the drain")
	if n := f.shard.Running(); n != 0 {
		t.Fatalf("running = %d after the drain, want 0", n)
	}
}

// An entity created by a remote message keeps its own copy of the ID: the
// ID the transport decoded shares the memory of the whole message it came
// in, which the entity must not keep alive for its lifetime.
func TestEntityCreatedRemotelyKeepsItsOwnID(t *testing.T) {
	f := newFixture(t, 0)
	received := []byte("xxa-remote-entityxx") // the message the ID came in
	id := unsafe.String(&received[2], len("a-remote-entity"))
	res := f.shard.Deliver(context.Background(), f.kind, f.work, id, workReq{}, false, true, false) // remote
	if res.Err != nil || !res.Admitted {
		t.Fatal(res)
	}
	f.shard.ReplyWritten()
	e := f.shard.entities.get(f.kind, id)
	if e == nil {
		t.Fatal("no resident entity after the ask")
	}
	if e.key.ID != id || unsafe.StringData(e.key.ID) == unsafe.StringData(id) {
		t.Fatalf("the entity's ID %q shares the memory of the message it came in", e.key.ID)
	}
}
