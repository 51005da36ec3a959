package main

import (
	"slices"
	"sort"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/runner"
)

// fire is one recorded reminder tick, timed by its handler's start.
type fire struct {
	pid         int
	runner      string
	shard       int
	epoch       int64
	tick        uint64
	missed      uint64
	redelivered bool
	start       int64
}

// ownership is one (process, shard, epoch) ownership by the runners' own
// records: from its acquisition to its release, its loss, the runner's
// detach or the process's death. A key can own several in turn: a
// cutover given up after the release reopens the shard on the same
// runner at the same epoch (acquired again).
type ownership struct {
	from, until int64
}

// reminderResume is the bound of the reminders' liveness rule
// (runner/internal/reminders): once the store answers and a shard stays
// owned with no cutover under way, its reminders fire within one period
// plus a second (the longest retry of the call they wait for) plus
// OpTimeout (a call the fault left hanging). The cluster's convergence
// comes after both.
const reminderResume = time.Second + runner.DefaultOpTimeout

// admittedBy is when a handler whose first record came at start passed
// the start gate, at the latest. A tick counts as fired when its handler
// starts, and the gate admits it: a SIGSTOP between the gate and the
// handler's first record (a pause that ended within frozenBeforeStart of
// it) moves that record past the stop, while the tick fired before it —
// and past the detach instant, so the next owner fires it again,
// Redelivered. Such a fire is placed at the stop (or just after the
// process's record before it, when the signal landed later), the instant
// checks 1 and 6 judge it by too.
func (c *checker) admittedBy(pid int, prev, start int64) int64 {
	inc := c.in.incarnations[pid]
	if inc == nil {
		return start
	}
	for _, p := range inc.pauses {
		if p[0] < start && p[1] > start-int64(frozenBeforeStart) {
			return min(start, max(p[0], prev+1))
		}
	}
	return start
}

// reminders is check 8.
func (c *checker) reminders() {
	type okey struct {
		pid   int
		shard int
		epoch int64
	}
	owned := map[okey][]*ownership{} // in acquisition order
	last := func(k okey) *ownership {
		if os := owned[k]; len(os) > 0 {
			return os[len(os)-1]
		}
		return nil
	}
	open := map[int]map[okey]*ownership{} // pid -> its ownerships not ended
	unplanned := map[int][]int64{}        // shard -> instants of unplanned losses
	endAll := func(pid int, t int64, planned bool) {
		for k, o := range open[pid] {
			o.until = t
			if !planned {
				unplanned[k.shard] = append(unplanned[k.shard], t)
			}
		}
		open[pid] = nil
	}
	byEntity := map[string][]fire{}
	execStart := map[[2]int64]int64{} // (pid, inst) -> its last handler start
	for pid, recs := range c.perPID {
		var prev int64 // the process's record before this one
		for _, r := range recs {
			k := okey{pid, r.Shard, r.Epoch}
			switch r.Kind {
			case runnerproc.HistStart:
				execStart[[2]int64{int64(pid), r.Inst}] = c.admittedBy(pid, prev, r.Mono)
			case runnerproc.HistAcquired:
				o := &ownership{from: r.Mono, until: never}
				owned[k] = append(owned[k], o)
				if open[pid] == nil {
					open[pid] = map[okey]*ownership{}
				}
				open[pid][k] = o
			case runnerproc.HistReleased:
				if o := last(k); o != nil {
					o.until = r.Mono
					delete(open[pid], k)
				}
			case runnerproc.HistLost:
				if o := last(k); o != nil {
					o.until = r.Mono
					delete(open[pid], k)
				}
				unplanned[r.Shard] = append(unplanned[r.Shard], r.Mono)
			case runnerproc.HistUnrecorded:
				unplanned[r.Shard] = append(unplanned[r.Shard], r.Mono)
			case runnerproc.HistDetached:
				endAll(pid, r.Mono, false)
			case runnerproc.HistFire:
				start := execStart[[2]int64{int64(pid), r.Inst}]
				byEntity[r.Entity+"/"+r.Detail] = append(byEntity[r.Entity+"/"+r.Detail], fire{pid: pid, runner: r.Runner, shard: r.Shard,
					epoch: r.Epoch, tick: r.Tick, missed: r.Missed, redelivered: r.Redelivered, start: start})
			}
			prev = r.Mono
		}
		if d := c.deathOf(pid); d != never {
			endAll(pid, d, false)
		}
	}
	// A SIGSTOP longer than the TTL loses the process's shards while it
	// cannot record anything: each shard it owned when stopped counts as
	// lost during the stop. (Not at its first instant: the harness takes
	// that before it sends SIGSTOP, and the process may still record a
	// tick until the signal lands — seed 19 of a 20-run session.)
	frozen := map[int][][2]int64{} // shard -> stops of a process owning it
	for k, os := range owned {
		inc := c.in.incarnations[k.pid]
		if inc == nil {
			continue
		}
		for _, o := range os {
			for _, p := range inc.pauses {
				if o.from <= p[0] && p[0] <= o.until {
					frozen[k.shard] = append(frozen[k.shard], p)
				}
			}
		}
	}
	lossBetween := func(shard int, a, b int64) bool {
		return slices.ContainsFunc(unplanned[shard], func(t int64) bool { return t >= a && t <= b }) ||
			slices.ContainsFunc(frozen[shard], func(p [2]int64) bool { return p[0] <= b && p[1] >= a })
	}
	keys := make([]string, 0, len(byEntity))
	for k := range byEntity {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		fs := byEntity[key]
		sort.SliceStable(fs, func(i, j int) bool { return fs[i].start < fs[j].start })
		c.st.ReminderFires += len(fs)
		for i, f := range fs {
			if f.redelivered {
				c.st.ReminderRedelivered++
			}
			if !slices.ContainsFunc(owned[okey{f.pid, f.shard, f.epoch}], func(o *ownership) bool { return o.from <= f.start && f.start <= o.until }) {
				c.violate("reminder %s: tick %d fired on %s (pid %d) under epoch %d of shard %d at %s, outside that ownership",
					key, f.tick, f.runner, f.pid, f.epoch, f.shard, at(f.start))
			}
			if i == 0 {
				continue
			}
			p := fs[i-1]
			switch {
			case f.tick < p.tick:
				c.violate("reminder %s went backwards: tick %d on %s at %s after tick %d on %s at %s", key, f.tick, f.runner, at(f.start), p.tick, p.runner, at(p.start))
			case !f.redelivered && f.tick != p.tick+f.missed+1:
				c.violate("reminder %s: tick %d (missed %d) on %s at %s after tick %d on %s at %s: a tick lost or fired twice, not marked redelivered",
					key, f.tick, f.missed, f.runner, at(f.start), p.tick, p.runner, at(p.start))
			case f.redelivered && f.tick-f.missed > p.tick+1:
				c.violate("reminder %s: redelivered tick %d (missed %d) leaves ticks after %d unfired", key, f.tick, f.missed, p.tick)
			case f.redelivered && !lossBetween(f.shard, p.start, f.start):
				c.violate("reminder %s: tick %d redelivered on %s at %s after tick %d on %s at %s with no unplanned loss of shard %d between",
					key, f.tick, f.runner, at(f.start), p.tick, p.runner, at(p.start), f.shard)
			}
		}
	}
	// Liveness: every reminder fires within one period plus the library's
	// bound (reminderResume) after the cluster converged, and within
	// 2 x TTL of a SIGKILL of the runner it last fired on.
	for i := range min(c.in.p.Reminders, c.in.p.Entities) {
		if c.in.converged == 0 {
			break
		}
		key := entityID(i) + "/tick"
		fs := byEntity[key]
		j := slices.IndexFunc(fs, func(f fire) bool { return f.start > c.in.converged })
		if j < 0 {
			c.violate("reminder %s did not fire after the cluster converged at %s", key, at(c.in.converged))
			continue
		}
		d := time.Duration(fs[j].start - c.in.converged)
		c.st.ReminderResume = append(c.st.ReminderResume, d)
		if d > reminderPeriod+reminderResume {
			c.violate("reminder %s fired again %v after the cluster converged at %s, more than one period plus %v", key, d.Round(time.Millisecond), at(c.in.converged), reminderResume)
		}
	}
	for pid, inc := range c.in.incarnations {
		if inc.killed == 0 {
			continue
		}
		var worst time.Duration
		worstPID := 0 // the process that fired the slowest one again
		n := 0
		for _, key := range keys {
			fs := byEntity[key]
			j := sort.Search(len(fs), func(j int) bool { return fs[j].start > inc.killed })
			if j == 0 || fs[j-1].pid != pid {
				continue // not on the killed runner when it died
			}
			n++
			if j == len(fs) {
				c.violate("reminder %s never fired again after %s (pid %d) was killed at %s", key, inc.id, pid, at(inc.killed))
				continue
			}
			if d := time.Duration(fs[j].start - inc.killed); d > worst {
				worst, worstPID = d, fs[j].pid
			}
		}
		if n == 0 {
			continue
		}
		c.st.ReminderRecovery = append(c.st.ReminderRecovery, worst)
		// The bound is the suite's convergence limit: the killed runner
		// restarts with its ID at once, so its shards wait for the old
		// lease to expire (TTL), then for the new process to register,
		// acquire them and activate their entities under the suite's load
		// (BENCHMARKS.md gives the measured distribution).
		if limit := 2 * c.in.p.TTL; worst > limit {
			c.timing(worst-limit, []int{worstPID}, inc.killed, inc.killed+int64(worst),
				"the reminders of %s (pid %d, killed at %s) fired again up to %v later (on pid %d), more than 2 x TTL (%v)",
				inc.id, pid, at(inc.killed), worst.Round(time.Millisecond), worstPID, limit)
		}
	}
}
