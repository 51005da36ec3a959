package runner_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// acct is a counter that survives planned moves: it checkpoints in Release
// and restores in Activate; Warm pre-loads the checkpoint on the new owner.
type acct struct {
	id     string
	n      int64
	warmed bool
	hooks  *hookTrace
}

type hookTrace struct {
	mu     sync.Mutex
	events []string // "<runner> <hook> <shard>"
	warms  atomic.Int64
}

func (h *hookTrace) add(runner, hook string, shard sharding.ShardID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, fmt.Sprintf("%s %s %d", runner, hook, shard))
}

func (h *hookTrace) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

type acctReq struct{ By int64 }

type acctResp struct {
	N      int64
	Runner string
}

func (a *acct) Inc(ctx context.Context, r acctReq) (acctResp, error) {
	a.n += r.By
	info, _ := runner.ShardInfoFrom(ctx)
	return acctResp{N: a.n, Runner: info.Runner}, nil
}

func loadCount(b []byte) int64 { return int64(binary.BigEndian.Uint64(b)) }

func (a *acct) Warm(ctx context.Context, info entity.WarmInfo) error {
	a.hooks.warms.Add(1)
	a.warmed = true
	return nil
}

func (a *acct) Activate(ctx context.Context, info entity.ActivateInfo) error {
	b, ok, err := info.Restore(ctx)
	if err != nil {
		return err
	}
	if ok {
		a.n = loadCount(b)
	}
	return nil
}

func (a *acct) Release(ctx context.Context, info entity.ReleaseInfo) error {
	return info.Checkpoint(ctx, binary.BigEndian.AppendUint64(nil, uint64(a.n)))
}

// handoffEnv is a real-etcd cluster of hosting runners plus a gateway.
type handoffEnv struct {
	t      *testing.T
	c      *cluster
	kind   *entity.Kind[acct]
	inc    *entity.MethodRef[acct, acctReq, acctResp]
	hooks  *hookTrace
	gw     *etcdRunner
	shards int
	ttl    time.Duration
	// hook behaviour knobs (per runner ID)
	blockWarm    sync.Map // runner ID -> chan struct{} (WarmShard blocks until closed or ctx)
	blockRelease sync.Map // runner ID -> chan struct{} (ReleaseShard blocks)
}

func newHandoffEnv(t *testing.T, shards int, ttl time.Duration) *handoffEnv {
	e := &handoffEnv{t: t, c: startEtcdCluster(t), hooks: &hookTrace{}, shards: shards, ttl: ttl}
	e.kind = entity.NewKind("acct", func(id string) *acct { return &acct{id: id, hooks: e.hooks} })
	e.inc = entity.Method(e.kind, "inc", (*acct).Inc)
	e.gw = e.c.start(runner.Config{ID: "gateway", NumShards: shards, ClientOnly: true})
	if err := e.gw.Register(e.kind); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *handoffEnv) start(id string) *etcdRunner {
	cfg := runner.Config{
		ID: id, NumShards: e.shards, ListenAddr: "127.0.0.1:0", LeaseTTL: e.ttl,
		WarmShard: func(ctx context.Context, s sharding.ShardID, from string) error {
			e.hooks.add(id, "WarmShard", s)
			if ch, ok := e.blockWarm.Load(id); ok {
				select {
				case <-ch.(chan struct{}):
				case <-ctx.Done():
				}
			}
			return nil
		},
		ReleaseShard: func(ctx context.Context, s sharding.ShardID, to string) error {
			e.hooks.add(id, "ReleaseShard", s)
			if ch, ok := e.blockRelease.Load(id); ok {
				select {
				case <-ch.(chan struct{}):
				case <-ctx.Done():
				}
			}
			return nil
		},
	}
	r := e.c.start(cfg)
	if err := r.Register(e.kind); err != nil {
		e.t.Fatal(err)
	}
	return r
}

// load drives steady asks to n entities from the gateway and records the
// acknowledged increments and latencies.
type load struct {
	acked   []atomic.Int64
	failed  atomic.Int64
	errs    []error
	mu      sync.Mutex
	lat     []time.Duration
	latAt   []time.Time
	stop    chan struct{}
	wg      sync.WaitGroup
	entries int
}

func (e *handoffEnv) drive(entities, callers int) *load {
	l := &load{acked: make([]atomic.Int64, entities), stop: make(chan struct{}), entries: entities}
	for g := range callers {
		l.wg.Go(func() {
			for i := g; ; i += callers {
				select {
				case <-l.stop:
					return
				default:
				}
				n := i % entities
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				t0 := time.Now()
				_, err := e.inc.Ask(ctx, e.gw, fmt.Sprintf("acct-%d", n), acctReq{By: 1})
				d := time.Since(t0)
				cancel()
				if err != nil {
					l.failed.Add(1)
					l.mu.Lock()
					l.errs = append(l.errs, err)
					l.mu.Unlock()
					continue
				}
				l.acked[n].Add(1)
				l.mu.Lock()
				l.lat = append(l.lat, d)
				l.latAt = append(l.latAt, t0)
				l.mu.Unlock()
			}
		})
	}
	return l
}

func (l *load) finish(t *testing.T) {
	t.Helper()
	close(l.stop)
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("asks hanging")
	}
}

// latencies returns p50/p99/max of the asks started in [from, to).
func (l *load) latencies(from, to time.Time) (p50, p99, mx time.Duration, n int) {
	l.mu.Lock()
	var ds []time.Duration
	for i, at := range l.latAt {
		if !at.Before(from) && at.Before(to) {
			ds = append(ds, l.lat[i])
		}
	}
	l.mu.Unlock()
	if len(ds) == 0 {
		return 0, 0, 0, 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1], len(ds)
}

// checkCounters asks every entity once more (By 0) and compares with the
// acknowledged increments.
func (e *handoffEnv) checkCounters(l *load) {
	e.t.Helper()
	bad := 0
	for n := range l.entries {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := e.inc.Ask(ctx, e.gw, fmt.Sprintf("acct-%d", n), acctReq{})
		cancel()
		if err != nil || got.N != l.acked[n].Load() {
			if bad++; bad <= 5 {
				e.t.Errorf("acct-%d = %d (%v), acknowledged %d", n, got.N, err, l.acked[n].Load())
			}
		}
	}
	if bad > 0 {
		e.t.Errorf("%d of %d counters differ from their acknowledged increments", bad, l.entries)
	}
}

// movesOf returns, per shard, the ownership changes between live runners
// after since, as "from->to".
func movesOf(evs []runner.Event, since time.Time) map[sharding.ShardID][]string {
	owner := map[sharding.ShardID]string{}
	released := map[sharding.ShardID]string{}
	out := map[sharding.ShardID][]string{}
	for _, ev := range evs {
		switch x := ev.(type) {
		case runner.ShardAcquired:
			if from := released[x.Shard]; from != "" && from != x.Runner && !x.Time.Before(since) {
				out[x.Shard] = append(out[x.Shard], from+"->"+x.Runner)
			}
			owner[x.Shard], released[x.Shard] = x.Runner, ""
		case runner.ShardReleased:
			if owner[x.Shard] == x.Runner {
				owner[x.Shard], released[x.Shard] = "", x.Runner
			}
		case runner.ShardLost:
			if owner[x.Shard] == x.Runner {
				owner[x.Shard], released[x.Shard] = "", ""
			}
		}
	}
	return out
}

// checkPhases verifies that every planned move went warming -> ready ->
// drained -> cutover, in that order.
func checkPhases(t *testing.T, evs []runner.Event, moves map[sharding.ShardID][]string) {
	t.Helper()
	type key struct {
		shard    sharding.ShardID
		from, to string
	}
	seq := map[key][]string{}
	for _, ev := range evs {
		if p, ok := ev.(runner.HandoffPhase); ok && p.Phase != runner.PhaseAborted {
			k := key{p.Shard, p.From, p.To}
			seq[k] = append(seq[k], p.Phase)
		}
	}
	bad := 0
	for shard, ms := range moves {
		for _, m := range ms {
			var from, to string
			fmt.Sscanf(stringsReplace(m), "%s %s", &from, &to)
			got := seq[key{shard, from, to}]
			want := []string{runner.PhaseWarming, runner.PhaseReady, runner.PhaseDrained, runner.PhaseCutover}
			if !isSubsequence(want, got) {
				if bad++; bad <= 5 {
					t.Errorf("shard %d moved %s without the handoff phases: %v", shard, m, got)
				}
			}
		}
	}
}

func stringsReplace(m string) string {
	for i := 0; i+1 < len(m); i++ {
		if m[i] == '-' && m[i+1] == '>' {
			return m[:i] + " " + m[i+2:]
		}
	}
	return m
}

func isSubsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// cutoverWindows returns, for every ownership change after since, the
// time no runner owned the shard: from the old owner's ShardReleased to the
// new owner's ShardAcquired.
func cutoverWindows(evs []runner.Event, since, until time.Time) []time.Duration {
	released := map[sharding.ShardID]time.Time{}
	var out []time.Duration
	for _, ev := range evs {
		switch x := ev.(type) {
		case runner.ShardReleased:
			if !x.Time.Before(since) && x.Time.Before(until) {
				released[x.Shard] = x.Time
			}
		case runner.ShardAcquired:
			if at, ok := released[x.Shard]; ok {
				out = append(out, x.Time.Sub(at))
				delete(released, x.Shard)
			}
		}
	}
	slices.Sort(out)
	return out
}

func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %v p99 %v max %v (n=%d)", ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1], len(ds))
}

func countMoves(moves map[sharding.ShardID][]string) int {
	n := 0
	for _, ms := range moves {
		n += len(ms)
	}
	return n
}

func TestEtcdHandoffScaleUpAndDown(t *testing.T) {
	e := newHandoffEnv(t, 64, 0)
	rs := []*etcdRunner{e.start("a"), e.start("b"), e.start("c")}
	e.c.waitPartition(rs, 64, 30*time.Second)
	l := e.drive(2000, 32)
	time.Sleep(time.Second)

	upAt := time.Now()
	rs = append(rs, e.start("d"))
	e.c.waitPartition(rs, 64, 60*time.Second)
	upDone := time.Now()
	time.Sleep(500 * time.Millisecond)

	downAt := time.Now()
	rs[3].shutdown(t)
	rs = rs[:3]
	e.c.waitPartition(rs, 64, 60*time.Second)
	downDone := time.Now()
	time.Sleep(500 * time.Millisecond)
	l.finish(t)

	evs := e.c.rec.all()
	upMoves, downMoves := movesOf(evs, upAt), movesOf(evs, downAt)
	if l.failed.Load() != 0 {
		for i, err := range l.errs {
			if i < 5 {
				t.Errorf("failed ask: %v", err)
			}
		}
		t.Fatalf("%d asks failed during planned moves, want 0", l.failed.Load())
	}
	checkPhases(t, evs, upMoves)
	checkPhases(t, evs, downMoves)
	checkSingleOwner(t, evs)
	// upMoves holds the scale-down's moves too.
	if countMoves(upMoves) == countMoves(downMoves) {
		t.Fatal("scale-up moved no shard")
	}
	if countMoves(downMoves) == 0 {
		t.Fatal("scale-down moved no shard")
	}
	before50, before99, _, _ := l.latencies(upAt.Add(-time.Second), upAt)
	p50, p99, mx, n := l.latencies(upAt, upDone)
	t.Logf("scale-up 3->4: %d shards moved in %v; %d asks during the move: p50 %v p99 %v max %v (steady before: p50 %v p99 %v)",
		countMoves(upMoves)-countMoves(downMoves), upDone.Sub(upAt).Round(time.Millisecond), n, p50, p99, mx, before50, before99)
	p50, p99, mx, n = l.latencies(downAt, downDone)
	t.Logf("scale-down 4->3: %d shards moved in %v; %d asks during the move: p50 %v p99 %v max %v",
		countMoves(downMoves), downDone.Sub(downAt).Round(time.Millisecond), n, p50, p99, mx)
	t.Logf("cutover window (old owner released -> new owner acquired): scale-up %s; scale-down %s",
		quantiles(cutoverWindows(evs, upAt, downAt)), quantiles(cutoverWindows(evs, downAt, time.Now())))
	e.checkCounters(l)
	if e.hooks.warms.Load() == 0 {
		t.Error("no entity was warmed")
	}
}

func TestEtcdHandoffRapidJoins(t *testing.T) {
	e := newHandoffEnv(t, 64, 0)
	rs := []*etcdRunner{e.start("a")}
	e.c.waitPartition(rs, 64, 30*time.Second)
	l := e.drive(2000, 32)
	time.Sleep(500 * time.Millisecond)
	joinAt := time.Now()
	for _, id := range []string{"b", "c", "d", "e"} {
		rs = append(rs, e.start(id))
		time.Sleep(100 * time.Millisecond)
	}
	e.c.waitPartition(rs, 64, 60*time.Second)
	time.Sleep(500 * time.Millisecond)
	l.finish(t)
	evs := e.c.rec.all()
	if l.failed.Load() != 0 {
		for i, err := range l.errs {
			if i < 5 {
				t.Errorf("failed ask: %v", err)
			}
		}
		t.Fatalf("%d asks failed during rapid joins, want 0", l.failed.Load())
	}
	moves := movesOf(evs, joinAt)
	if countMoves(moves) == 0 {
		t.Fatal("the joins moved no shard between live runners")
	}
	checkPhases(t, evs, moves) // no move between live runners without warm + drain
	checkSingleOwner(t, evs)
	t.Logf("4 runners joined 100ms apart: %d moves, all through the handoff phases", countMoves(moves))
	e.checkCounters(l)
}

// Shard-level hooks: once per move, on the right runners, in order:
// WarmShard on the new owner, then ReleaseShard on the old one, then the
// new owner serves.
func TestEtcdHandoffShardHookOrder(t *testing.T) {
	e := newHandoffEnv(t, 16, 0)
	a := e.start("a")
	e.c.waitPartition([]*etcdRunner{a}, 16, 30*time.Second)
	joinAt := time.Now()
	b := e.start("b")
	e.c.waitPartition([]*etcdRunner{a, b}, 16, 30*time.Second)
	evs := e.c.rec.all()
	moves := movesOf(evs, joinAt)
	hooks := e.hooks.list()
	for shard, ms := range moves {
		if len(ms) != 1 || ms[0] != "a->b" {
			t.Fatalf("shard %d moves %v, want one a->b", shard, ms)
		}
		var seq []string
		for _, h := range hooks {
			var who, hook string
			var s sharding.ShardID
			fmt.Sscanf(h, "%s %s %d", &who, &hook, &s)
			if s == shard {
				seq = append(seq, who+" "+hook)
			}
		}
		if !slices.Equal(seq, []string{"b WarmShard", "a ReleaseShard"}) {
			t.Errorf("shard %d hooks %v, want [b WarmShard, a ReleaseShard] once each", shard, seq)
		}
		// b serves only after a's ReleaseShard: b acquired after a released.
		var released, acquired time.Time
		for _, ev := range evs {
			switch x := ev.(type) {
			case runner.ShardReleased:
				if x.Shard == shard && x.Runner == "a" && x.Time.After(joinAt) {
					released = x.Time
				}
			case runner.ShardAcquired:
				if x.Shard == shard && x.Runner == "b" {
					acquired = x.Time
				}
			}
		}
		if released.IsZero() || !acquired.After(released) {
			t.Errorf("shard %d: b serving at %v, a released at %v", shard, acquired, released)
		}
	}
	if len(moves) == 0 {
		t.Fatal("nothing moved")
	}
}

// The new owner dies while warming: its record vanishes with its lease and
// the old owner carries on.
func TestEtcdHandoffNewOwnerDiesWhileWarming(t *testing.T) {
	e := newHandoffEnv(t, 16, 3*time.Second)
	a := e.start("a")
	e.c.waitPartition([]*etcdRunner{a}, 16, 30*time.Second)
	l := e.drive(200, 8)
	block := make(chan struct{})
	e.blockWarm.Store("b", block)
	b := e.start("b")
	waitFor(t, 10*time.Second, "b warming", func() bool {
		for _, ev := range e.c.rec.all() {
			if p, ok := ev.(runner.HandoffPhase); ok && p.Phase == runner.PhaseWarming && p.Runner == "b" {
				return true
			}
		}
		return false
	})
	b.stop() // crash while warming
	// a keeps everything once b's lease (3s) expired.
	e.c.waitPartition([]*etcdRunner{a}, 16, 30*time.Second)
	time.Sleep(500 * time.Millisecond)
	l.finish(t)
	close(block)
	evs := e.c.rec.all()
	checkSingleOwner(t, evs)
	for _, ev := range evs {
		if x, ok := ev.(runner.ShardAcquired); ok && x.Runner == "b" {
			t.Fatalf("b owned shard %d although it died warming", x.Shard)
		}
	}
	if l.failed.Load() != 0 {
		t.Fatalf("%d asks failed while the new owner died warming (a kept serving), want 0: %v", l.failed.Load(), l.errs[0])
	}
	e.checkCounters(l)
}

// The old owner dies while draining: its lock expires and the new owner,
// already warm, acquires through the watch.
func TestEtcdHandoffOldOwnerDiesWhileDraining(t *testing.T) {
	e := newHandoffEnv(t, 16, 3*time.Second)
	a := e.start("a")
	e.c.waitPartition([]*etcdRunner{a}, 16, 30*time.Second)
	block := make(chan struct{})
	defer close(block)
	e.blockRelease.Store("a", block)
	joinAt := time.Now()
	b := e.start("b")
	waitFor(t, 10*time.Second, "a draining", func() bool {
		for _, h := range e.hooks.list() {
			if len(h) > 14 && h[:14] == "a ReleaseShard" {
				return true
			}
		}
		return false
	})
	crashed := time.Now()
	a.stop()
	e.c.waitPartition([]*etcdRunner{b}, 16, 30*time.Second)
	evs := e.c.rec.all()
	checkSingleOwner(t, evs)
	t.Logf("old owner crashed while draining at +%v; b owned all 16 shards %v later",
		crashed.Sub(joinAt).Round(time.Millisecond), time.Since(crashed).Round(time.Millisecond))
}

// Every counter equals its acknowledged increments after several planned
// moves (state through Release checkpoints and Activate restores).
func TestEtcdHandoffStateContinuity(t *testing.T) {
	e := newHandoffEnv(t, 32, 0)
	rs := []*etcdRunner{e.start("a"), e.start("b")}
	e.c.waitPartition(rs, 32, 30*time.Second)
	l := e.drive(300, 16)
	for round := range 3 {
		id := fmt.Sprintf("x%d", round)
		rs = append(rs, e.start(id))
		e.c.waitPartition(rs, 32, 60*time.Second)
		time.Sleep(200 * time.Millisecond)
		rs[len(rs)-1].shutdown(t)
		rs = rs[:len(rs)-1]
		e.c.waitPartition(rs, 32, 60*time.Second)
	}
	l.finish(t)
	if l.failed.Load() != 0 {
		t.Fatalf("%d asks failed, want 0: %v", l.failed.Load(), l.errs[0])
	}
	e.checkCounters(l)
	checkSingleOwner(t, e.c.rec.all())
	var total int64
	for i := range l.acked {
		total += l.acked[i].Load()
	}
	t.Logf("6 planned moves: %d acknowledged increments on 300 counters, all present", total)
}

// TestHandoffFollowsOwnerReattachedUnderSameLease: a takeover prepared
// while the old owner was detached names the old owner's epoch; when the
// old owner re-attaches under the same lease it rewrites its locks (new
// epochs), so the new owner starts over with the new epoch and the move
// completes as a handoff at once — not as a plain release after
// HandoffWait (the record's FromEpoch no longer matched).
func TestHandoffFollowsOwnerReattachedUnderSameLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		t0 := time.Now()
		cfgA := detachCfg("a")
		cfgA.HandoffWait = time.Minute
		c, a, recA := startOwningAll(t, cfgA)
		time.Sleep(time.Until(t0.Add(5500 * time.Millisecond)))
		a.store.FailKeepAlive(true)
		waitDetached(t, recA, 20*time.Second)

		cfgB := detachCfg("b")
		cfgB.HandoffWait = time.Minute
		recB := &recorder{}
		b := start(t, c, recB, cfgB)
		waitFor(t, 20*time.Second, "b's takeovers ready while a is detached", func() bool {
			ready := 0
			for _, ev := range recB.all() {
				if p, ok := ev.(runner.HandoffPhase); ok && p.Phase == runner.PhaseReady {
					ready++
				}
			}
			return ready > 0
		})
		a.store.FailKeepAlive(false)
		var ra []runner.Reattached
		waitFor(t, 30*time.Second, "a re-attaches", func() bool { ra = reattached(recA.all()); return len(ra) > 0 })
		if ra[0].NewLease {
			t.Fatal("a re-attached with a new lease; this test needs the same one")
		}
		waitFor(t, 10*time.Second, "b owns its shards by handoff", func() bool { return len(b.Owned()) > 0 && len(a.Owned())+len(b.Owned()) == 8 && len(a.Owned()) < 8 })
		cut := 0
		for _, ev := range recA.all() {
			if p, ok := ev.(runner.HandoffPhase); ok && p.Phase == runner.PhaseCutover && p.To == "b" {
				cut++
			}
		}
		if cut != len(b.Owned()) {
			t.Fatalf("a handed %d shards over, b owns %d: some moved by plain release", cut, len(b.Owned()))
		}
	})
}
