package main

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// Rule 10: singletons, shard workers and remembered entities, from their
// own records (runnerproc's always.go): every runner process runs
// Singletons singletons and a shard worker whose bodies record their start
// and return, and hosts the remembered kind Keeper, whose entities record
// each life (Activate to Release or the end of its context); the driver
// touches Keepers keepers once, before the faults, and one more right
// before each graceful stop (driver.touchBeforeStop).

// span is one run of a singleton or shard worker, or one life of a keeper.
type span struct {
	life   bool   // a keeper's life (else a worker's run)
	name   string // the worker's name or the keeper's ID
	pid    int
	runner string
	shard  int
	epoch  int64
	inst   int64
	start  int64
	// end: the end record; without one, the process's SIGKILL, else its
	// exit, else never.
	end   int64
	ended bool   // an end record
	class string // the end record's runnerproc.End* class
	// stillborn: its context had ended before its body started (it ran
	// nothing; a worker's Started hook or a keeper's activation crossed
	// the end of its ownership).
	stillborn bool
}

func (s *span) what() string {
	switch {
	case s.life:
		return "remembered entity " + s.name
	case s.name == runnerproc.ShardWorkerName:
		return fmt.Sprintf("shard %d's worker", s.shard)
	default:
		return "singleton " + s.name
	}
}

func (s *span) String() string {
	return fmt.Sprintf("%s (pid %d, epoch %d) %s..%s", s.runner, s.pid, s.epoch, at(s.start), atEnd(s.end))
}

// alwaysKey names one always-on thing: a singleton, a shard's worker, a
// keeper.
type alwaysKey struct {
	life  bool
	name  string
	shard int
}

// tenure is one ownership of a shard at an epoch by one process, by its
// own records: from its acquisition to its release (how "released"), its
// loss ("lost"), its runner's detach ("detached") or the process's death
// ("killed"); until is never while it lasts.
type tenure struct {
	from, until int64
	how         string
}

type tenureKey struct {
	pid   int
	shard int
	epoch int64
}

// Bounds of rule 10.
const (
	// resumeHonour: how soon after its process resumed from a SIGSTOP a
	// run caught frozen past its detach instant must return (its runner
	// detaches as soon as it runs again: the instant is past).
	resumeHonour = time.Second
)

// alwaysStats are rule 10's figures.
type alwaysStats struct {
	Runs, Lives int // singleton and shard-worker runs, keeper lives recorded
	Overlaps    int // two runs (lives) of one thing at once: violations
	// FencedOnly: overlaps whose older run was on a process frozen
	// (SIGSTOP) past its detach instant — it could not honour its
	// context; the newer run's higher epoch fences its writes. Resumed:
	// how long after its process was seen running again (the harness
	// polls /proc after SIGCONT: it may see it a little after the process
	// ran, hence negative values) each such run returned.
	FencedOnly int
	Resumed    []time.Duration
	Stillborn  int // runs and lives started with their context already ended
	Ambiguous  int // starts outside their ownership right after a SIGSTOP (not judged)
	// Late: keepers touched right before their runner's graceful stop
	// and checked at the end; LateExcused: those not checked, their
	// shard lost unplanned (or its release's write failed) after the
	// touch.
	Late, LateExcused int
	// Again: how soon each thing ran again, by cause and kind of thing,
	// from the interruption to the next run's start: after a SIGKILL of
	// the process (from the kill), a planned move or a graceful shutdown
	// (from the old run's return), a SIGSTOP (from the stop), a detach or
	// a lost lock (from the old run's return; its bound counts from the
	// fault's heal if that came later).
	Again map[again][]time.Duration
}

// again is a cause of interruption and a kind of always-on thing.
type again struct{ cause, kind string }

// Causes of interruption and kinds of things (alwaysStats.Again).
const (
	causeKill    = "a SIGKILL"
	causePlanned = "a planned move or shutdown"
	causePause   = "a SIGSTOP"
	causeOther   = "a detach or lost lock"

	kindSingleton = "singletons"
	kindWorker    = "shard workers"
	kindKeeper    = "remembered entities"
)

var (
	againCauses = []string{causeKill, causePlanned, causePause, causeOther}
	againKinds  = []string{kindSingleton, kindWorker, kindKeeper}
)

func (s *span) kind() string {
	switch {
	case s.life:
		return kindKeeper
	case s.name == runnerproc.ShardWorkerName:
		return kindWorker
	}
	return kindSingleton
}

func (a *alwaysStats) add(b alwaysStats) {
	a.Runs += b.Runs
	a.Lives += b.Lives
	a.Overlaps += b.Overlaps
	a.FencedOnly += b.FencedOnly
	a.Resumed = append(a.Resumed, b.Resumed...)
	a.Stillborn += b.Stillborn
	a.Ambiguous += b.Ambiguous
	a.Late += b.Late
	a.LateExcused += b.LateExcused
	for k, ds := range b.Again {
		if a.Again == nil {
			a.Again = map[again][]time.Duration{}
		}
		a.Again[k] = append(a.Again[k], ds...)
	}
}

// always is rule 10.
func (c *checker) always() {
	spans := c.alwaysSpans()
	tenures := c.tenures()
	byKey := map[alwaysKey][]*span{}
	for _, s := range spans {
		if s.life {
			c.st.Always.Lives++
		} else {
			c.st.Always.Runs++
		}
		if s.stillborn {
			c.st.Always.Stillborn++
		}
		k := alwaysKey{s.life, s.name, s.shard}
		byKey[k] = append(byKey[k], s)
		c.insideOwnership(s, tenures)
	}
	keys := make([]alwaysKey, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := keys[i], keys[j]
		if a.life != b.life {
			return !a.life
		}
		if a.name != b.name {
			return a.name < b.name
		}
		return a.shard < b.shard
	})
	// A keeper touched right before its runner's graceful stop whose
	// shard was then lost unplanned may have lost its marker with it: it
	// need not run again.
	excused := map[string]bool{}
	for _, l := range c.in.late {
		if c.lostAfter(l, tenures) {
			excused[l.id] = true
		}
	}
	for _, k := range keys {
		ss := byKey[k]
		sort.SliceStable(ss, func(i, j int) bool { return ss[i].start < ss[j].start })
		c.neverTwoAtOnce(ss)
		if !k.life || !excused[k.name] {
			c.runningAgain(ss, tenures)
		}
	}
	c.onceAtTheEnd(byKey, tenures, excused)
}

// alwaysSpans gathers the runs and lives from the processes' records.
func (c *checker) alwaysSpans() []*span {
	var out []*span
	for pid, recs := range c.perPID {
		open := map[int64]*span{}
		for _, r := range recs {
			switch r.Kind {
			case runnerproc.HistRun, runnerproc.HistLife:
				s := &span{life: r.Kind == runnerproc.HistLife, name: r.Entity, pid: pid, runner: r.Runner, shard: r.Shard,
					epoch: r.Epoch, inst: r.Inst, start: r.Mono, end: c.goneAt(pid), stillborn: r.Err != ""}
				if r.Kind == runnerproc.HistRun && r.Detail == runnerproc.RunSingleton {
					if want := int(runner.SingletonShard(r.Entity, c.in.p.Shards)); r.Shard != want {
						c.violate("singleton %s ran on %s (pid %d) for shard %d, not for shard %d its name maps to", r.Entity, r.Runner, pid, r.Shard, want)
					}
				}
				open[r.Inst] = s
				out = append(out, s)
			case runnerproc.HistRunEnd, runnerproc.HistLifeEnd:
				if s := open[r.Inst]; s != nil {
					s.end, s.ended, s.class = r.Mono, true, r.Detail
					delete(open, r.Inst)
				}
			}
		}
	}
	return out
}

// goneAt is when a process stopped running anything: its SIGKILL, else
// its exit once seen, else never.
func (c *checker) goneAt(pid int) int64 {
	inc := c.in.incarnations[pid]
	switch {
	case inc == nil:
		return never
	case inc.killed != 0:
		return inc.killed
	case inc.exited != 0:
		return inc.exited
	}
	return never
}

// tenures gathers every process's ownerships by its own records.
func (c *checker) tenures() map[tenureKey][]*tenure {
	out := map[tenureKey][]*tenure{}
	for pid, recs := range c.perPID {
		open := map[tenureKey]*tenure{}
		closeAll := func(t int64, how string) {
			for k, o := range open {
				o.until, o.how = t, how
				delete(open, k)
			}
		}
		for _, r := range recs {
			k := tenureKey{pid, r.Shard, r.Epoch}
			switch r.Kind {
			case runnerproc.HistAcquired:
				if open[k] == nil { // else serving again after a cutover given up
					o := &tenure{from: r.Mono, until: never}
					open[k] = o
					out[k] = append(out[k], o)
				}
			case runnerproc.HistReleased, runnerproc.HistLost:
				if o := open[k]; o != nil {
					o.until, o.how = r.Mono, r.Kind
					delete(open, k)
				}
			case runnerproc.HistDetached:
				closeAll(r.Mono, r.Kind)
			}
		}
		if d := c.deathOf(pid); d != never {
			closeAll(d, "killed")
		}
	}
	return out
}

// tenureAt returns s's process's ownership of its shard at its epoch
// around instant t (slack either side), or nil.
func tenureAt(tenures map[tenureKey][]*tenure, s *span, t int64, slack time.Duration) *tenure {
	for _, o := range tenures[tenureKey{s.pid, s.shard, s.epoch}] {
		if t >= o.from-int64(slack) && (o.until == never || t <= o.until+int64(slack)) {
			return o
		}
	}
	return nil
}

// insideOwnership: every run and life starts within its process's
// ownership of its shard at its epoch. The ShardAcquired event is
// published just after the shard's workers are started, and a run
// admitted just before its ownership ended records its start a little
// after: admitSlack either side. A start right after a SIGSTOP (admitted
// before it) is not judged, and a stillborn one ran nothing.
func (c *checker) insideOwnership(s *span, tenures map[tenureKey][]*tenure) {
	if s.stillborn || tenureAt(tenures, s, s.start, admitSlack) != nil {
		return
	}
	if c.pausedWithin(s.pid, s.start-int64(frozenBeforeStart), s.start) {
		c.st.Always.Ambiguous++
		return
	}
	c.violate("%s started on %s (pid %d) at %s under epoch %d of shard %d, outside that ownership by its runner's records",
		s.what(), s.runner, s.pid, at(s.start), s.epoch, s.shard)
}

// neverTwoAtOnce is parts (a) and (b): no two runs (lives) of one thing
// overlap in time, unless the older one's process was frozen past its
// detach instant (fenced-only, counted).
func (c *checker) neverTwoAtOnce(ss []*span) {
	for i, x := range ss {
		for _, y := range ss[i+1:] {
			if y.start >= x.end {
				continue // ss is by start: y began after x ended
			}
			older, newer := x, y
			if y.epoch < x.epoch {
				older, newer = y, x
			}
			if d, ok := c.fencedOnly(older, newer); ok {
				c.st.Always.FencedOnly++
				c.st.Always.Resumed = append(c.st.Always.Resumed, d)
				continue
			}
			c.st.Always.Overlaps++
			c.violate("%s ran twice at once: %s and %s", x.what(), x, y)
		}
	}
}

// fencedOnly reports whether the overlap of older and newer is one the
// guarantee allows — never two at once among instances that honour their
// context: older's process was frozen (SIGSTOP) before newer started,
// older had started before the freeze, its runner's detach instant (lease
// deadline - margin) came while it was frozen, it returned within
// resumeHonour of the SIGCONT, and newer runs under a higher epoch (the
// fencing token that makes older's outside writes refusable). It returns
// how long after the SIGCONT older returned.
func (c *checker) fencedOnly(older, newer *span) (time.Duration, bool) {
	inc := c.in.incarnations[older.pid]
	if inc == nil || older.pid == newer.pid || older.epoch >= newer.epoch || !older.ended {
		return 0, false
	}
	for _, p := range inc.pauses {
		if p[0] >= newer.start || older.start > p[1]+int64(frozenBeforeStart) || older.end > p[1]+int64(resumeHonour) {
			continue
		}
		if instant, ok := c.detachAfter(older.pid, older.start); !ok || instant > p[1]+int64(resumeSlack) {
			continue
		}
		return time.Duration(older.end - p[1]), true
	}
	return 0, false
}

// detachAfter returns the detach instant of pid's first detach recorded
// after from: its lease deadline - margin, or the record's time if earlier
// or no deadline was known.
func (c *checker) detachAfter(pid int, from int64) (int64, bool) {
	for _, r := range c.perPID[pid] {
		if r.Kind != runnerproc.HistDetached || r.Mono < from {
			continue
		}
		instant := r.Mono
		if r.Deadline != 0 {
			instant = min(instant, r.Deadline-int64(c.margin))
		}
		return instant, true
	}
	return 0, false
}

// runningAgain is part (c): after every run (life) interrupted by a
// SIGKILL, a SIGSTOP, a planned move, a graceful shutdown, a detach or a
// lost lock, the thing runs again — on whichever process owns its shard
// next — within 2 x TTL of the interruption: for a SIGKILL the kill (the
// runner restarts with its ID at once; its shards wait for the old lease
// to expire, as rule 8's reminders do), for a SIGSTOP the stop, else the
// old run's return. After a detach or a lost lock the bound counts from
// the heal of the fault then in progress if that came later: a runner
// whose etcd links are slow (latency) keeps its lease alive on the server,
// so its shards wait for it to re-attach once healed — and a toxic's
// removal can take toxiproxy 25 s under load (internal/testenv). The
// runs ended by the final stop are not followed.
func (c *checker) runningAgain(ss []*span, tenures map[tenureKey][]*tenure) {
	limit := 2 * c.in.p.TTL
	for _, x := range ss {
		if x.stillborn {
			continue
		}
		var t0 int64
		by, cause := "", ""
		if pauseStart, ok := c.frozenEnd(x); ok {
			t0, by, cause = pauseStart, causePause, "its process was stopped (SIGSTOP)"
		} else if inc := c.in.incarnations[x.pid]; !x.ended && inc != nil && inc.killed != 0 && x.end == inc.killed {
			t0, by, cause = inc.killed, causeKill, "its process was killed"
		} else if !x.ended || (c.in.stopped != 0 && x.end >= c.in.stopped) {
			continue // ran until the end of the session
		} else if o := tenureAt(tenures, x, x.start, admitSlack); o != nil && o.how == runnerproc.HistReleased {
			t0, by, cause = x.end, causePlanned, "its shard was released (a planned move or shutdown)"
		} else {
			t0, by, cause = x.end, causeOther, "it returned ("+x.class+")"
		}
		i := slices.IndexFunc(ss, func(y *span) bool { return y.start > t0 && !y.stillborn })
		if i < 0 {
			if c.in.converged != 0 {
				c.violate("%s never ran again after %s at %s (%s)", x.what(), cause, at(t0), x)
			}
			continue
		}
		if c.st.Always.Again == nil {
			c.st.Always.Again = map[again][]time.Duration{}
		}
		k := again{by, x.kind()}
		c.st.Always.Again[k] = append(c.st.Always.Again[k], time.Duration(ss[i].start-t0))
		from, healed := t0, ""
		if by == causeOther {
			for _, f := range c.in.faults {
				if f.Healed != 0 && f.Begin <= t0 && t0 < f.Healed && f.Healed > from {
					from, healed = f.Healed, fmt.Sprintf(" (the fault %v in progress then was healed at %s)", f.fault, at(f.Healed))
				}
			}
		}
		if late := time.Duration(ss[i].start - from); late > limit {
			c.timing(late-limit, []int{ss[i].pid}, from, ss[i].start, "%s ran again %v after %s at %s%s (%s; next %s), more than 2 x TTL (%v)",
				x.what(), late.Round(time.Millisecond), cause, at(t0), healed, x, ss[i], limit)
		}
	}
}

// frozenEnd reports whether run x, started before a SIGSTOP of its
// process, returned right after the SIGCONT (frozen while its time ran
// out), and when that stop began.
func (c *checker) frozenEnd(x *span) (int64, bool) {
	inc := c.in.incarnations[x.pid]
	if inc == nil || !x.ended {
		return 0, false
	}
	for _, p := range inc.pauses {
		if x.start < p[0] && x.end >= p[0] && x.end <= p[1]+int64(resumeHonour) {
			return p[0], true
		}
	}
	return 0, false
}

// lostAfter reports whether the ownership that answered l's touch ended
// otherwise than by a release, or its release recorded nothing
// (RemindersUnrecorded: the write that carries the markers failed).
func (c *checker) lostAfter(l lateKeeper, tenures map[tenureKey][]*tenure) bool {
	for k, os := range tenures {
		if k.shard != l.resp.Shard || k.epoch != l.resp.Epoch {
			continue
		}
		for _, o := range os {
			if o.until != never && o.until >= l.at && o.how != runnerproc.HistReleased {
				return true
			}
		}
		for _, r := range c.perPID[k.pid] {
			if r.Kind == runnerproc.HistUnrecorded && r.Shard == k.shard && r.Epoch == k.epoch {
				return true
			}
		}
	}
	return false
}

// onceAtTheEnd is part (d): when the session stops (after the cluster
// converged), every singleton, every shard's worker and every keeper runs
// exactly once, on the process owning its shard then.
func (c *checker) onceAtTheEnd(byKey map[alwaysKey][]*span, tenures map[tenureKey][]*tenure, excused map[string]bool) {
	t := c.in.stopped
	if c.in.converged == 0 || t == 0 {
		return
	}
	var want []alwaysKey
	for s := range c.in.p.Shards {
		want = append(want, alwaysKey{false, runnerproc.ShardWorkerName, s})
	}
	for i := range c.in.p.Singletons {
		name := runnerproc.SingletonName(i)
		want = append(want, alwaysKey{false, name, int(runner.SingletonShard(name, c.in.p.Shards))})
	}
	for i := range c.in.p.Keepers {
		id := runnerproc.KeeperID(i)
		want = append(want, alwaysKey{true, id, int(sharding.ShardOf(id, c.in.p.Shards))})
	}
	// A keeper touched right before its runner's graceful stop runs too:
	// the release wrote its marker if its put was still queued. Unless
	// its shard was lost unplanned after the touch, or the release could
	// not write (the marker was then lost with the shard).
	for _, l := range c.in.late {
		if excused[l.id] {
			c.st.Always.LateExcused++
			continue
		}
		c.st.Always.Late++
		want = append(want, alwaysKey{true, l.id, l.resp.Shard})
	}
	for _, k := range want {
		var live []*span
		for _, s := range byKey[k] {
			if !s.stillborn && s.start <= t && s.end > t {
				live = append(live, s)
			}
		}
		name := (&span{life: k.life, name: k.name, shard: k.shard}).what()
		switch {
		case len(live) != 1:
			c.violate("%s runs %d times when the session stops at %s, once the cluster converged, want once on its shard's owner: %v", name, len(live), at(t), live)
		case tenureAt(tenures, live[0], t, 0) == nil:
			c.violate("%s runs on %s when the session stops at %s, which does not own shard %d at epoch %d then", name, live[0], at(t), k.shard, live[0].epoch)
		}
	}
}
