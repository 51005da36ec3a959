package runner_test

import (
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

func TestEtcdHandoffScaleUpAndDown(t *testing.T) {
	t.Parallel()
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
	if !e.c.premiseOfNoDetach(rs[0].Config()) {
		checkSingleOwner(t, evs)
		return
	}
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
	t.Parallel()
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
	if !e.c.premiseOfNoDetach(rs[0].Config()) {
		checkSingleOwner(t, evs)
		return
	}
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
	e.c.waitAcquiredRecorded(a, b)
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	if !e.c.premiseOfNoDetach(rs[0].Config()) {
		checkSingleOwner(t, e.c.rec.all())
		return
	}
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
		recB := newRecorder(t)
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
