package main

import (
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/storage"
)

// hist builds a synthetic run for the checker: times are seconds.
type hist struct {
	in *checkInput
}

const sec = int64(time.Second)

func newHist() *hist {
	p := defaultParams()
	return &hist{in: &checkInput{p: p, incarnations: map[int]*incarnation{}, deleteSeen: func(int64) int64 { return 0 }}}
}

func (h *hist) rec(r runnerproc.Record) { h.in.history = append(h.in.history, r) }

// runner registers pid as runner id under lease at t.
func (h *hist) runner(pid int, id string, lease int64, t int64) {
	h.in.incarnations[pid] = &incarnation{id: id}
	h.rec(runnerproc.Record{Kind: runnerproc.HistRegistered, Mono: t * sec, PID: pid, Runner: id, Lease: lease})
}

// exec records a handler of entity on shard from start to end (seconds,
// end < 0: never ended), returning value, with the runner's deadline at
// the start far away.
func (h *hist) exec(pid int, shard int, epoch int64, entity string, inst int64, lease int64, start, end float64, value int64) {
	id := h.in.incarnations[pid].id
	h.rec(runnerproc.Record{Kind: runnerproc.HistStart, Mono: int64(start * 1e9), PID: pid, Runner: id, Shard: shard, Epoch: epoch,
		Entity: entity, Inst: inst, Lease: lease, Deadline: int64(start*1e9) + 10*sec})
	if end >= 0 {
		h.rec(runnerproc.Record{Kind: runnerproc.HistEnd, Mono: int64(end * 1e9), PID: pid, Runner: id, Shard: shard, Epoch: epoch,
			Entity: entity, Inst: inst, Value: value})
	}
}

func (h *hist) activate(pid int, shard int, epoch int64, entity string, inst int64, t float64, restored int64) {
	h.rec(runnerproc.Record{Kind: runnerproc.HistActivate, Mono: int64(t * 1e9), PID: pid, Runner: h.in.incarnations[pid].id,
		Shard: shard, Epoch: epoch, Entity: entity, Inst: inst, Value: restored})
}

func (h *hist) ack(entity int, pid int, inst, epoch int64, value int64, done float64) {
	h.in.asks = append(h.in.asks, ask{Entity: entity, OK: true, Done: int64(done * 1e9),
		Resp: runnerproc.CountResp{Value: value, Epoch: epoch, PID: pid, Inst: inst}})
}

func (h *hist) pause(pid int, from, to float64) {
	inc := h.in.incarnations[pid]
	inc.pauses = append(inc.pauses, [2]int64{int64(from * 1e9), int64(to * 1e9)})
}

func wantViolation(t *testing.T, h *hist, substr string) stats {
	t.Helper()
	vs, st := check(h.in)
	for _, v := range vs {
		if strings.Contains(v, substr) {
			return st
		}
	}
	t.Fatalf("check found %q, want a violation containing %q", vs, substr)
	return st
}

func wantClean(t *testing.T, h *hist) stats {
	t.Helper()
	vs, st := check(h.in)
	if len(vs) > 0 {
		t.Fatalf("check found %q, want none", vs)
	}
	return st
}

// Each case is a history that breaks (or keeps) one guarantee: the checker
// must tell them apart, or the fault suite proves nothing.

func TestCheckerFlagsTwoOwnersAtOnce(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.runner(2, "r2", 200, 0)
	h.exec(1, 7, 10, "c1", 1, 100, 1.0, 1.5, 1)
	h.exec(2, 7, 20, "c2", 1, 200, 1.2, 1.3, 1) // same shard, other owner, overlapping
	wantViolation(t, h, "executed by two owners at once")
}

func TestCheckerAcceptsOneOwnerRunningEntitiesConcurrently(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.exec(1, 7, 10, "c1", 1, 100, 1.0, 1.5, 1)
	h.exec(1, 7, 10, "c2", 2, 100, 1.2, 1.3, 1)
	h.ack(1, 1, 1, 10, 1, 1.6)
	h.ack(2, 1, 2, 10, 1, 1.4)
	wantClean(t, h)
}

func TestCheckerAcceptsAPausedHandlerWhoseResultWasWithheld(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.runner(2, "r2", 200, 0)
	h.exec(1, 7, 10, "c1", 1, 100, 1.0, 9.0, 5) // frozen from 1.1 to 8.9
	h.pause(1, 1.1, 8.9)
	h.exec(2, 7, 20, "c1", 1, 200, 7.0, 7.1, 1)
	h.ack(1, 2, 1, 20, 1, 7.2)
	st := wantClean(t, h)
	if st.LateHandlers != 1 || st.LateWithheld != 1 || st.Pauses != 1 || st.PausesHit != 1 {
		t.Fatalf("stats = %+v, want 1 pause that hit a handler, 1 late handler, withheld", st)
	}
}

// TestCheckerJudgesAHandlerStartedRightAfterAPauseAsLate: a handler whose
// first record came just after its process resumed (admitted before the
// SIGSTOP: seed 166, 0.7 ms before its runner's watchdog detached) is a
// late handler, allowed only while its result is withheld; one starting
// well after the resume is two owners at once.
func TestCheckerJudgesAHandlerStartedRightAfterAPauseAsLate(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.runner(2, "r2", 200, 0)
	h.exec(2, 7, 20, "c1", 1, 200, 7.0, 9.5, 1)
	h.pause(1, 1.1, 8.995)
	h.exec(1, 7, 10, "c1", 1, 100, 9.0, 9.0005, 5) // 5 ms after the resume
	if st := wantClean(t, h); st.LateHandlers != 1 {
		t.Fatalf("late handlers = %d, want 1", st.LateHandlers)
	}
	h.ack(1, 1, 1, 10, 5, 9.1)
	wantViolation(t, h, "late reply acknowledged")
	h.in.asks = h.in.asks[:len(h.in.asks)-1]
	h.in.incarnations[1].pauses[0][1] = int64(8.9 * 1e9) // resumed 100 ms before the start
	wantViolation(t, h, "executed by two owners at once")
}

func TestCheckerFlagsALateReplyAcknowledged(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.runner(2, "r2", 200, 0)
	h.exec(1, 7, 10, "c1", 1, 100, 1.0, 9.0, 5)
	h.pause(1, 1.1, 8.9)
	h.exec(2, 7, 20, "c1", 1, 200, 7.0, 7.1, 1)
	h.ack(1, 2, 1, 20, 1, 7.2)
	h.ack(1, 1, 1, 10, 5, 9.1) // the frozen owner's result reached the caller
	wantViolation(t, h, "late reply acknowledged")
}

func TestCheckerFlagsAStaleWriteAcceptedByEtcd(t *testing.T) {
	h := newHist()
	cp := func(rev, epoch int64) kvEvent {
		return kvEvent{Rev: rev, Put: true, Key: "checkpoints/7/runnerproc-counter%2Fc1", Value: storage.EncodeCheckpoint(storage.Epoch(epoch), []byte("3"))}
	}
	h.in.etcd = []kvEvent{
		{Rev: 10, Put: true, Key: "shards/7", Lease: 100},
		cp(11, 10), // under the lock's epoch: fine
		{Rev: 20, Put: true, Key: "shards/7", Lease: 200},
		cp(25, 10), // epoch 10 after the lock moved to epoch 20
	}
	wantViolation(t, h, "stale write accepted")
	h.in.etcd = h.in.etcd[:3]
	if st := wantClean(t, h); st.AcceptedWrites != 1 {
		t.Fatalf("accepted writes = %d, want 1", st.AcceptedWrites)
	}
}

func TestCheckerFlagsIncrementsLostOnAPlannedMove(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.runner(2, "r2", 200, 0)
	h.activate(1, 7, 10, "c1", 1, 1, 0)
	h.exec(1, 7, 10, "c1", 1, 100, 1.1, 1.2, 5)
	h.ack(1, 1, 1, 10, 5, 1.3)
	h.rec(runnerproc.Record{Kind: runnerproc.HistRelease, Mono: 2 * sec, PID: 1, Runner: "r1", Shard: 7, Epoch: 10, Entity: "c1", Inst: 1, Value: 5, OK: true})
	h.activate(2, 7, 20, "c1", 1, 3, 3) // restored 3: the acknowledged 4 and 5 are gone
	st := wantViolation(t, h, "lost on a planned move")
	if st.LostPlanned != 2 {
		t.Fatalf("lost on planned moves = %d, want 2", st.LostPlanned)
	}
}

func TestCheckerCountsUncheckpointedIncrementsLostToACrash(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.runner(2, "r2", 200, 0)
	h.activate(1, 7, 10, "c1", 1, 1, 0)
	h.exec(1, 7, 10, "c1", 1, 100, 1.1, 1.2, 5)
	h.rec(runnerproc.Record{Kind: runnerproc.HistCheckpoint, Mono: 1.15e9, PID: 1, Runner: "r1", Shard: 7, Epoch: 10, Entity: "c1", Inst: 1, Value: 3, OK: true})
	h.ack(1, 1, 1, 10, 5, 1.3)
	h.in.incarnations[1].killed = 2 * sec
	h.activate(2, 7, 20, "c1", 1, 8, 3)
	st := wantClean(t, h)
	if st.LostCrash != 2 || st.CrashMoves != 1 {
		t.Fatalf("stats = %+v, want 2 increments lost in 1 crash move", st)
	}
	// Restoring less than was checkpointed is a violation, crash or not.
	h.in.history[len(h.in.history)-1].Value = 2
	wantViolation(t, h, "checkpointed state lost")
}

func TestCheckerFlagsAHandlerStartedAfterTheDetachInstant(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.exec(1, 7, 10, "c1", 1, 100, 1.0, 1.1, 1)
	h.in.history[len(h.in.history)-2].Deadline = 1*sec + h.in.p.TTL.Nanoseconds()/3 - 60*time.Millisecond.Nanoseconds() // deadline - margin is 60 ms before the start
	wantViolation(t, h, "after the detach instant")
	// 1 ns after the instant: admitted just before it, allowed only while
	// its result is not acknowledged.
	h.in.history[len(h.in.history)-2].Deadline = 1*sec + h.in.p.TTL.Nanoseconds()/3 - 1
	if st := wantClean(t, h); st.AdmittedAtInstant != 1 {
		t.Fatalf("admitted at the instant = %d, want 1", st.AdmittedAtInstant)
	}
	h.ack(1, 1, 1, 10, 1, 1.2)
	wantViolation(t, h, "after the detach instant")
	h.in.asks = h.in.asks[:len(h.in.asks)-1]
	h.in.history[len(h.in.history)-2].Deadline = 1*sec + h.in.p.TTL.Nanoseconds()/3 - 60*time.Millisecond.Nanoseconds()
	// The same start right after the process was frozen is not judged:
	// the SIGSTOP may have fallen between admission and the record.
	h.pause(1, 0.5, 0.999)
	if st := wantClean(t, h); st.Ambiguous != 1 {
		t.Fatalf("ambiguous = %d, want 1", st.Ambiguous)
	}
}

func TestCheckerFlagsADetachAfterServerExpiry(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.in.etcd = []kvEvent{{Rev: 30, Key: "runners/r1", PrevLease: 100}}
	h.in.deleteSeen = func(rev int64) int64 { return 6 * sec }
	margin := h.in.p.TTL.Nanoseconds() / 3
	h.rec(runnerproc.Record{Kind: runnerproc.HistDetached, Mono: 7 * sec, PID: 1, Runner: "r1", Deadline: 6*sec + margin + 1})
	wantViolation(t, h, "not before its lease")

	h.in.history[len(h.in.history)-1].Deadline = 6*sec + margin - sec // the detach instant 1 s before expiry
	st := wantClean(t, h)
	if len(st.DetachMargins) != 1 || st.DetachMargins[0] != time.Second {
		t.Fatalf("detach margins = %v, want [1s]", st.DetachMargins)
	}
	h.in.history = h.in.history[:len(h.in.history)-1]
	wantViolation(t, h, "never detached")
}

func TestCheckerFlagsEpochsGoingBackwards(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.runner(2, "r2", 200, 0)
	h.rec(runnerproc.Record{Kind: runnerproc.HistAcquired, Mono: 1 * sec, PID: 1, Runner: "r1", Shard: 7, Epoch: 20})
	h.rec(runnerproc.Record{Kind: runnerproc.HistAcquired, Mono: 2 * sec, PID: 2, Runner: "r2", Shard: 7, Epoch: 10})
	wantViolation(t, h, "acquired epoch 10")
}

func TestCheckerFlagsARepliedValueNoHandlerProduced(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.exec(1, 7, 10, "c1", 1, 100, 1.0, 1.1, 1)
	h.ack(1, 1, 1, 10, 2, 1.2)
	wantViolation(t, h, "matches no handler execution")
}

func TestCheckerFlagsAReattachRightAfterAPause(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.rec(runnerproc.Record{Kind: runnerproc.HistDetached, Mono: 10 * sec, PID: 1, Runner: "r1"})
	h.pause(1, 11, 20)
	h.rec(runnerproc.Record{Kind: runnerproc.HistReattached, Mono: 20*sec + int64(5*time.Millisecond), PID: 1, Runner: "r1", Lease: 100})
	wantViolation(t, h, "less than RecoverWindow")
	h.in.history[len(h.in.history)-1].Mono = 20*sec + h.in.p.TTL.Nanoseconds()/3
	wantClean(t, h)
}

// TestCheckerSkipsAStaleActivationButNotItsHandlers: a frozen process that
// resumes mid-activation activates an entity under an epoch its shard has
// left (seed 6 of a session: r2 activated c1067 under epoch 2001 while r1
// served epoch 5469). That instance is no successor of anyone — the move
// r1 -> r3 is judged against r3's activation — and it must run no
// handler.
func TestCheckerSkipsAStaleActivationButNotItsHandlers(t *testing.T) {
	h := newHist()
	h.runner(1, "r1", 100, 0)
	h.runner(2, "r2", 200, 0)
	h.runner(3, "r3", 300, 0)
	h.activate(1, 7, 20, "c1", 1, 1, 0)
	h.exec(1, 7, 20, "c1", 1, 100, 1.1, 1.2, 5)
	h.ack(1, 1, 1, 20, 5, 1.3)
	h.activate(2, 7, 10, "c1", 2, 1.5, 3) // the zombie: an older epoch, an older state
	h.rec(runnerproc.Record{Kind: runnerproc.HistRelease, Mono: 2 * sec, PID: 1, Runner: "r1", Shard: 7, Epoch: 20, Entity: "c1", Inst: 1, Value: 5, OK: true})
	h.activate(3, 7, 30, "c1", 3, 3, 5)
	if st := wantClean(t, h); st.StaleActivations != 1 || st.PlannedMoves != 1 {
		t.Fatalf("stale activations %d, planned moves %d; want 1 and 1", st.StaleActivations, st.PlannedMoves)
	}
	h.exec(2, 7, 10, "c1", 2, 200, 1.6, 1.7, 4)
	wantViolation(t, h, "activated under epoch 10 after epoch 20 had been, and ran 1 handlers")
}

// stall records that pid went unscheduled from from to to (seconds).
func (h *hist) stall(pid int, from, to float64) {
	if h.in.stalls == nil {
		h.in.stalls = map[int]runnerproc.Stalls{}
	}
	h.in.stalls[pid] = append(h.in.stalls[pid], [2]int64{int64(from * 1e9), int64(to * 1e9)})
}

func wantStarved(t *testing.T, h *hist, substr string) stats {
	t.Helper()
	st := wantClean(t, h)
	for _, m := range st.Starved {
		if strings.Contains(m, substr) {
			return st
		}
	}
	t.Fatalf("starved = %q, want one containing %q", st.Starved, substr)
	return st
}

// TestCheckerReportsATimingBoundMissedByAStarvedProcessApart: a bound
// that holds only if the processes get the CPU (convergence, a handler's
// first record after its admission) missed by no more than a process
// measurably went unscheduled is reported apart (stats.Starved), not as a
// violation; missed by more, or with no stall, it is a violation; a
// stall that was a SIGSTOP (a fault with bounds of its own) excuses
// nothing.
func TestCheckerReportsATimingBoundMissedByAStarvedProcessApart(t *testing.T) {
	limit := 2 * defaultParams().TTL
	converge := func(h *hist, took time.Duration) {
		h.in.lastHeal, h.in.converged = 20*sec, 20*sec+int64(took)
		h.in.p.Reminders = 0 // none armed: their liveness after convergence is not this test's
	}
	h := newHist()
	h.runner(1, "r1", 100, 0)
	converge(h, limit+300*time.Millisecond)
	wantViolation(t, h, "more than 2 x TTL")
	h.stall(1, 25, 25.2) // 200 ms: less than the 300 ms over
	wantViolation(t, h, "more than 2 x TTL")
	h.stall(1, 26, 26.15) // 350 ms in all within the window
	wantStarved(t, h, "more than 2 x TTL")
	h.pause(1, 25.9, 26.2) // the second stall was a SIGSTOP
	wantViolation(t, h, "more than 2 x TTL")

	// A handler admitted before its detach instant whose first record came
	// 60 ms after it (more than admitSlack): excused by 10 ms or more of
	// stall after the instant, never when its result was acknowledged.
	h = newHist()
	h.runner(1, "r1", 100, 0)
	h.exec(1, 7, 10, "c1", 1, 100, 1.0, 1.1, 1)
	instant := 1*sec - 60*time.Millisecond.Nanoseconds()
	h.in.history[len(h.in.history)-2].Deadline = instant + h.in.p.TTL.Nanoseconds()/3
	wantViolation(t, h, "after the detach instant")
	h.stall(1, 0.5, 0.93) // before the instant: the handler may not have been admitted yet
	wantViolation(t, h, "after the detach instant")
	h.stall(1, 0.95, 0.97) // 20 ms after it
	wantStarved(t, h, "after the detach instant")
	h.ack(1, 1, 1, 10, 1, 1.2)
	wantViolation(t, h, "after the detach instant")
}
