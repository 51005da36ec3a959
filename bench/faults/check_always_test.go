package main

import (
	"testing"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// Histories that keep or break the always-on rules (rule 10): singletons,
// shard workers and remembered entities, from their own records.

// run records a run of worker name on shard from start to end (seconds;
// end < 0: no end record), ended by a cause of class.
func (h *hist) run(pid int, name string, shard int, epoch, inst int64, start, end float64, class string) {
	id := h.in.incarnations[pid].id
	what := runnerproc.RunWorker
	if name != runnerproc.ShardWorkerName {
		what = runnerproc.RunSingleton
	}
	h.rec(runnerproc.Record{Kind: runnerproc.HistRun, Mono: int64(start * 1e9), PID: pid, Runner: id, Shard: shard, Epoch: epoch,
		Entity: name, Inst: inst, Detail: what})
	if end >= 0 {
		h.rec(runnerproc.Record{Kind: runnerproc.HistRunEnd, Mono: int64(end * 1e9), PID: pid, Runner: id, Shard: shard, Epoch: epoch,
			Entity: name, Inst: inst, Detail: class})
	}
}

// life records a life of keeper id on shard from start to end.
func (h *hist) life(pid int, id string, shard int, epoch, inst int64, start, end float64, class string) {
	rid := h.in.incarnations[pid].id
	h.rec(runnerproc.Record{Kind: runnerproc.HistLife, Mono: int64(start * 1e9), PID: pid, Runner: rid, Shard: shard, Epoch: epoch,
		Entity: id, Inst: inst, Detail: "remembered"})
	if end >= 0 {
		h.rec(runnerproc.Record{Kind: runnerproc.HistLifeEnd, Mono: int64(end * 1e9), PID: pid, Runner: rid, Shard: shard, Epoch: epoch,
			Entity: id, Inst: inst, Detail: class})
	}
}

// detached records pid's detach at t, its lease deadline then being
// deadline.
func (h *hist) detached(pid int, t, deadline float64) {
	h.rec(runnerproc.Record{Kind: runnerproc.HistDetached, Mono: int64(t * 1e9), PID: pid, Runner: h.in.incarnations[pid].id,
		Deadline: int64(deadline * 1e9)})
}

var (
	single0      = runnerproc.SingletonName(0)
	single0Shard = int(runner.SingletonShard(single0, defaultParams().Shards))
)

// twoRunners: runners r1 (pid 1) and r2 (pid 2), no reminders (rule 8's
// liveness would want their ticks).
func twoRunners() *hist {
	h := newHist()
	h.in.p.Reminders = 0
	h.runner(1, "r1", 100, 0)
	h.runner(2, "r2", 200, 0)
	return h
}

func TestAlwaysAcceptsASingletonHandedOverAfterItReturned(t *testing.T) {
	h := twoRunners()
	h.owns(1, single0Shard, 10, 0.5, 3.5)
	h.run(1, single0, single0Shard, 10, 1, 1, 3.4, runnerproc.EndMoved)
	h.owns(2, single0Shard, 20, 3.6, -1)
	h.run(2, single0, single0Shard, 20, 1, 3.65, -1, "")
	st := wantClean(t, h)
	if ds := st.Always.Again[again{causePlanned, kindSingleton}]; st.Always.Runs != 2 || len(ds) != 1 || ds[0].Round(time.Millisecond) != 250*time.Millisecond {
		t.Fatalf("always = %+v, want 2 runs, one planned move followed 250ms later", st.Always)
	}
}

func TestAlwaysFlagsASingletonRunningTwiceAtOnce(t *testing.T) {
	h := twoRunners()
	h.owns(1, single0Shard, 10, 0.5, 3.5)
	h.run(1, single0, single0Shard, 10, 1, 1, 3.4, runnerproc.EndMoved)
	h.owns(2, single0Shard, 20, 3.2, -1)
	h.run(2, single0, single0Shard, 20, 1, 3.3, -1, "") // before r1's returned
	if st := wantViolation(t, h, "singleton singleton-0 ran twice at once"); st.Always.Overlaps != 1 {
		t.Fatalf("Overlaps = %d, want 1", st.Always.Overlaps)
	}
}

func TestAlwaysFlagsAShardWorkerRunningTwiceAtOnce(t *testing.T) {
	h := twoRunners()
	h.owns(1, 3, 10, 0.5, -1)
	h.owns(2, 3, 20, 2, -1)
	h.run(1, runnerproc.ShardWorkerName, 3, 10, 1, 1, 4, runnerproc.EndMoved)
	h.run(2, runnerproc.ShardWorkerName, 3, 20, 1, 2.5, -1, "")
	wantViolation(t, h, "shard 3's worker ran twice at once")
}

func TestAlwaysFlagsARememberedEntityLivingTwiceAtOnce(t *testing.T) {
	h := twoRunners()
	h.owns(1, 5, 10, 0.5, -1)
	h.owns(2, 5, 20, 2, -1)
	h.life(1, "k0", 5, 10, 1, 1, 4, runnerproc.EndMoved)
	h.life(2, "k0", 5, 20, 1, 2.5, -1, "")
	wantViolation(t, h, "remembered entity k0 ran twice at once")
}

// frozen: r1 runs the singleton from 1 s and is stopped from 2 s to 9 s;
// its detach instant (deadline 6 s - margin) falls in the stop; r2 takes
// the shard over at 7.5 s and runs it from 7.6 s; r1's run returns at
// end, after the SIGCONT.
func frozen(end float64) *hist {
	h := twoRunners()
	h.owns(1, single0Shard, 10, 0.5, -1)
	h.run(1, single0, single0Shard, 10, 1, 1, end, runnerproc.EndDetached)
	h.pause(1, 2, 9)
	h.detached(1, 9.01, 6)
	h.owns(2, single0Shard, 20, 7.5, -1)
	h.run(2, single0, single0Shard, 20, 1, 7.6, -1, "")
	return h
}

func TestAlwaysCountsARunFrozenPastItsDetachInstantAsFencedOnly(t *testing.T) {
	st := wantClean(t, frozen(9.05))
	a := st.Always
	if a.Overlaps != 0 || a.FencedOnly != 1 || len(a.Resumed) != 1 || a.Resumed[0].Round(time.Millisecond) != 50*time.Millisecond {
		t.Fatalf("always = %+v, want one fenced-only overlap, returned 50ms after the SIGCONT", a)
	}
	if ds := a.Again[again{causePause, kindSingleton}]; len(ds) != 1 || ds[0].Round(time.Millisecond) != 5600*time.Millisecond {
		t.Fatalf("Again = %v, want the singleton again 5.6s after a SIGSTOP (from the stop to the next run)", a.Again)
	}
}

func TestAlwaysFlagsAFrozenRunThatKeptRunningAfterItResumed(t *testing.T) {
	wantViolation(t, frozen(11), "ran twice at once")
}

func TestAlwaysFlagsAFrozenRunWhoseRunnerNeverDetached(t *testing.T) {
	h := twoRunners()
	h.owns(1, single0Shard, 10, 0.5, -1)
	h.run(1, single0, single0Shard, 10, 1, 1, 9.05, runnerproc.EndMoved)
	h.pause(1, 2, 9)
	h.owns(2, single0Shard, 20, 7.5, -1)
	h.run(2, single0, single0Shard, 20, 1, 7.6, -1, "")
	wantViolation(t, h, "ran twice at once")
}

func TestAlwaysFlagsAFrozenRunWithTheNewerEpoch(t *testing.T) {
	h := twoRunners()
	h.owns(1, single0Shard, 30, 0.5, -1)
	h.run(1, single0, single0Shard, 30, 1, 1, 9.05, runnerproc.EndDetached)
	h.pause(1, 2, 9)
	h.detached(1, 9.01, 6)
	h.owns(2, single0Shard, 20, 7.5, -1)
	h.run(2, single0, single0Shard, 20, 1, 7.6, -1, "")
	wantViolation(t, h, "ran twice at once")
}

// killed: r1 runs keeper k0 from 1 s and is killed at 3 s; r2 owns the
// shard from next-0.1 s and lives k0 again from next.
func killed(next float64) *hist {
	h := twoRunners()
	h.owns(1, 5, 10, 0.5, -1)
	h.life(1, "k0", 5, 10, 1, 1, -1, "")
	h.in.incarnations[1].killed = 3 * sec
	h.owns(2, 5, 20, next-0.1, -1)
	h.life(2, "k0", 5, 20, 1, next, -1, "")
	h.in.converged = int64(next+1) * sec
	return h
}

func TestAlwaysMeasuresRunningAgainAfterAKill(t *testing.T) {
	st := wantClean(t, killed(8.1))
	if a := st.Always; a.Lives != 2 || len(a.Again[again{causeKill, kindKeeper}]) != 1 || a.Again[again{causeKill, kindKeeper}][0].Round(time.Millisecond) != 5100*time.Millisecond {
		t.Fatalf("always = %+v, want 2 lives, running again 5.1s after the kill", a)
	}
}

func TestAlwaysFlagsRunningAgainLaterThanTwiceTheTTLAfterAKill(t *testing.T) {
	wantViolation(t, killed(14), "more than 2 x TTL")
}

func TestAlwaysFlagsAThingThatNeverRanAgain(t *testing.T) {
	h := twoRunners()
	h.owns(1, 5, 10, 0.5, -1)
	h.life(1, "k0", 5, 10, 1, 1, -1, "")
	h.in.incarnations[1].killed = 3 * sec
	h.in.converged = 20 * sec
	wantViolation(t, h, "remembered entity k0 never ran again after its process was killed")
}

func TestAlwaysFlagsARunStartedOutsideItsOwnership(t *testing.T) {
	h := twoRunners()
	h.owns(1, 3, 10, 0.5, 3.5)
	h.run(1, runnerproc.ShardWorkerName, 3, 10, 1, 1, 3.4, runnerproc.EndMoved)
	h.run(1, runnerproc.ShardWorkerName, 3, 10, 2, 5, 5.1, runnerproc.EndMoved) // after the release
	wantViolation(t, h, "outside that ownership")
}

// atTheEnd: two shards, one singleton, one keeper; at 10 s (the session
// stops) r1 owns shard 0 and r2 shard 1, each running what lives there
// unless skip names it, and r2 running the singleton a second time if
// twice.
func atTheEnd(skip string, twice bool) *hist {
	h := twoRunners()
	h.in.p.Shards, h.in.p.Singletons, h.in.p.Keepers = 2, 1, 1
	h.in.converged, h.in.stopped = 8*sec, 10*sec
	owner := func(shard int) int { return 1 + shard }
	for s := range 2 {
		h.owns(owner(s), s, int64(10+s), 0.5, -1)
		if skip != runnerproc.ShardWorkerName {
			h.run(owner(s), runnerproc.ShardWorkerName, s, int64(10+s), int64(1+s), 1, -1, "")
		}
	}
	ss := int(runner.SingletonShard(single0, 2))
	if skip != single0 {
		h.run(owner(ss), single0, ss, int64(10+ss), 5, 1, -1, "")
	}
	if twice {
		h.owns(2, ss, 30, 2, -1)
		h.run(2, single0, ss, 30, 6, 2, -1, "")
	}
	ks := int(sharding.ShardOf(runnerproc.KeeperID(0), 2))
	if skip != "k0" {
		h.life(owner(ks), "k0", ks, int64(10+ks), 7, 1, -1, "")
	}
	return h
}

func TestAlwaysAcceptsEachRunningOnceOnItsOwnerAtTheEnd(t *testing.T) {
	wantClean(t, atTheEnd("", false))
}

func TestAlwaysFlagsAMissingSingletonWorkerOrKeeperAtTheEnd(t *testing.T) {
	for _, tc := range []struct{ skip, want string }{
		{single0, "singleton singleton-0 runs 0 times when the session stops"},
		{runnerproc.ShardWorkerName, "shard 0's worker runs 0 times when the session stops"},
		{"k0", "remembered entity k0 runs 0 times when the session stops"},
	} {
		wantViolation(t, atTheEnd(tc.skip, false), tc.want)
	}
}

func TestAlwaysFlagsASingletonRunningTwiceAtTheEnd(t *testing.T) {
	wantViolation(t, atTheEnd("", true), "runs 2 times when the session stops")
}

func TestAlwaysFlagsARunOnAFormerOwnerAtTheEnd(t *testing.T) {
	h := atTheEnd("k0", false)
	ks := int(sharding.ShardOf(runnerproc.KeeperID(0), 2))
	h.owns(2, ks, 5, 0.2, 0.4) // r2 owned the shard before, at epoch 5
	h.life(2, "k0", ks, 5, 9, 0.3, -1, "")
	wantViolation(t, h, "which does not own shard")
}

// detachedDuring: r1's worker of shard 3 returns at its detach at 4 s,
// while a latency fault on r1 lasts from 2 s to healed; r1 runs it again
// (re-attached, same lease) from next.
func detachedDuring(healed, next float64) *hist {
	h := twoRunners()
	h.owns(1, 3, 10, 0.5, -1)
	h.run(1, runnerproc.ShardWorkerName, 3, 10, 1, 1, 4, runnerproc.EndDetached)
	h.detached(1, 4.001, 5.7)
	h.owns(1, 3, 30, next-0.01, -1)
	h.run(1, runnerproc.ShardWorkerName, 3, 30, 2, next, -1, "")
	h.in.faults = []applied{{fault: fault{Kind: faultLatency, Target: "r1"}, Begin: 2 * sec, Healed: int64(healed * 1e9)}}
	return h
}

func TestAlwaysCountsRunningAgainAfterADetachFromTheFaultsHeal(t *testing.T) {
	st := wantClean(t, detachedDuring(30, 31))
	if ds := st.Always.Again[again{causeOther, kindWorker}]; len(ds) != 1 || ds[0].Round(time.Millisecond) != 27*time.Second {
		t.Fatalf("Again = %v, want the worker again 27s after its detach (from the return)", st.Always.Again)
	}
	wantViolation(t, detachedDuring(30, 42), "more than 2 x TTL")
	wantViolation(t, detachedDuring(6, 17), "more than 2 x TTL")
}

// lateKeeperAtTheEnd: atTheEnd, and keeper late0-0 touched at 0.3 s on r2,
// which owned shard 0 at epoch 5 from 0.2 s until its graceful stop
// released it at 0.4 s (or, if lost, lost it then); if lives, the keeper
// runs at the end on the shard's owner then, r1.
func lateKeeperAtTheEnd(lost, lives bool) *hist {
	h := atTheEnd("", false)
	h.owns(2, 0, 5, 0.2, -1)
	end := runnerproc.HistReleased
	if lost {
		end = runnerproc.HistLost
	}
	h.rec(runnerproc.Record{Kind: end, Mono: int64(0.4 * 1e9), PID: 2, Runner: "r2", Shard: 0, Epoch: 5})
	h.life(2, "late0-0", 0, 5, 20, 0.3, 0.4, "")
	h.in.late = []lateKeeper{{id: "late0-0", resp: runnerproc.TouchResp{Runner: "r2", Shard: 0, Epoch: 5}, at: int64(0.3 * 1e9)}}
	if lives {
		h.life(1, "late0-0", 0, 10, 21, 1, -1, "")
	}
	return h
}

func TestAlwaysAcceptsAKeeperTouchedBeforeAGracefulStopRunningOnTheNextOwner(t *testing.T) {
	if st := wantClean(t, lateKeeperAtTheEnd(false, true)); st.Always.Late != 1 {
		t.Errorf("late keepers checked: %d, want 1", st.Always.Late)
	}
}

// The release wrote no marker (the bug this rule found: the put was still
// queued when the shard's release began).
func TestAlwaysFlagsAKeeperTouchedBeforeAGracefulStopMissingAtTheEnd(t *testing.T) {
	wantViolation(t, lateKeeperAtTheEnd(false, false), "remembered entity late0-0 runs 0 times when the session stops")
}

// A shard lost unplanned after the touch may lose a marker not written yet.
func TestAlwaysExcusesAKeeperWhoseShardWasLostAfterItsTouch(t *testing.T) {
	if st := wantClean(t, lateKeeperAtTheEnd(true, false)); st.Always.LateExcused != 1 || st.Always.Late != 0 {
		t.Errorf("late keepers checked %d, excused %d; want 0 and 1", st.Always.Late, st.Always.LateExcused)
	}
}
