package main

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/runner/runnertest/linearize"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// checkInput is everything one run left behind.
type checkInput struct {
	p            params
	history      []runnerproc.Record // every runner process's history, any order
	asks         []ask               // the driver's calls
	etcd         []kvEvent           // the namespace's history read back from etcd
	deleteSeen   func(rev int64) int64
	incarnations map[int]*incarnation      // by PID
	converged    int64                     // when the cluster converged after the last fault (Mono; 0: never)
	lastHeal     int64                     // when the last fault was healed (Mono)
	stalls       map[int]runnerproc.Stalls // each process's stalls (runner processes' histories and the driver's probe), by PID
	stopped      int64                     // when the final stop of the runners began (Mono; 0: not recorded)
	faults       []applied                 // the faults injected, with their instants
	late         []lateKeeper              // keepers touched right before a graceful stop
}

// stats are one run's figures.
type stats struct {
	Faults       map[string]int
	AsksOK       int
	AsksShed     int               // due while MaxInFlight asks waited: not sent
	AsksFailed   map[string]int    // by class
	Examples     map[string]string // one error per class
	Handlers     int               // handler executions recorded
	Pauses       int               // SIGSTOPs of runner processes
	PausesHit    int               // ... while a handler of that process was running
	LateHandlers int               // handlers that finished after their shard moved (paused mid-handler)
	LateWithheld int               // ... whose result the caller got as an error (never acknowledged)
	LostPlanned  int64             // acknowledged increments missing after a planned move (must be 0)
	LostCrash    int64             // acknowledged increments lost to a crash or detach (not checkpointed)
	CrashMoves   int               // instance changes after a crash or detach
	PlannedMoves int               // instance changes after a release
	// activations under an epoch older than one already activated (a
	// frozen process resuming mid-activation); none may run a handler
	StaleActivations int
	FencedWrites     int // checkpoint writes rejected by fencing
	AcceptedWrites   int // checkpoint writes accepted (read back from etcd)
	Expiries         int // leases that expired on the server
	DetachMargins    []time.Duration
	Detaches         int
	Ambiguous        int // handler starts a SIGSTOP may have separated from their admission
	// handlers admitted just before their runner's detach instant whose
	// first record came after it (< admitSlack), result not acknowledged
	AdmittedAtInstant int
	// Reminders (check 8): ticks fired, of which redelivered after an
	// unplanned loss, and how long after each SIGKILL the killed runner's
	// reminders fired again.
	ReminderFires       int
	ReminderRedelivered int
	ReminderRecovery    []time.Duration
	ReminderResume      []time.Duration // per reminder: the cluster's convergence -> its first fire after it
	// Timing rules missed by a process measurably starved meanwhile
	// (not violations: see checker.timing), each with its excuse.
	Starved []string
	// The processes' stalls (runnerproc.ProbeStalls; SIGSTOPs left out):
	// how many, their sum and the longest.
	Stalls               int
	StallTotal, StallMax time.Duration
	Lin                  linearize.Report // rule 9: the registers' histories
	Always               alwaysStats      // rule 10: singletons, shard workers, remembered entities
}

func (s *stats) failedTotal() int {
	n := 0
	for _, v := range s.AsksFailed {
		n += v
	}
	return n
}

// execution is one handler run: start and end records of one instance.
type execution struct {
	pid        int
	runner     string
	shard      int
	epoch      int64
	entity     string
	inst       int64
	lease      int64
	deadline   int64 // the runner's lease deadline at the start (Mono)
	start, end int64 // end: the end record, the process's death, or +inf
	ended      bool
	value      int64
	err        string
	tick       bool // a reminder tick's handler (no reply comes of it)
}

const never = int64(1<<63 - 1)

// check runs every check over a run's records and returns the violations
// found and the run's figures. The checks:
//
//  1. single writer: no two handler executions of one shard by different
//     (process, epoch) overlap in time, except a handler its process was
//     frozen in (SIGSTOP) — physics — whose result must then not have been
//     acknowledged (check 5);
//  2. the epochs of a shard's successive owners strictly increase;
//  3. no checkpoint write accepted by etcd under an epoch that was not the
//     shard lock's current one at that revision (read back from etcd);
//  4. every acknowledged increment survives a planned move (0 lost), and
//     after a crash or detach only what was not checkpointed is lost
//     (counted), never a checkpointed value;
//  5. no acknowledged result from a handler that finished after a newer
//     epoch of its shard had started serving;
//  6. no handler started after its runner's detach instant (lease deadline
//     - margin) or after its lease expired on the server, and every detach
//     instant precedes the server-side expiry of its lease;
//  8. reminders (check_reminders.go): every tick fired on the owner of its
//     shard inside that ownership; a reminder's ticks never go backwards, a
//     tick not marked redelivered follows the previous one exactly (its
//     missed count explains any gap), a redelivered one covers every tick
//     after the previous fire and follows an unplanned loss of the shard;
//     every reminder fires again within one period plus 1 s + OpTimeout
//     after the cluster converged (the library's liveness rule), and
//     within 2 x TTL of a SIGKILL of the runner it fired on (which
//     restarts with the same ID at once).
//  10. always-on work (check_always.go): no two runs of a singleton or of
//     a shard's worker, no two lives of a remembered entity, at once —
//     but an older one on a process frozen past its detach instant
//     (fenced-only, counted); every one started inside its ownership;
//     after a crash, a freeze, a move or a detach each runs again within
//     2 x TTL; when the session stops each runs exactly once, on its
//     shard's owner.
func check(in *checkInput) ([]string, stats) {
	c := &checker{in: in, margin: in.p.TTL / 3}
	c.st.AsksFailed, c.st.Examples = map[string]int{}, map[string]string{}
	c.index()
	c.countStalls()
	c.convergence()
	c.singleWriter()
	c.epochsIncrease()
	c.fencedWrites()
	c.increments()
	c.lateReplies()
	c.detachBeforeExpiry()
	c.healthBeforeReattach()
	c.reminders()
	c.always()
	c.countAsks()
	return c.violations, c.st
}

type checker struct {
	in         *checkInput
	margin     time.Duration
	violations []string
	st         stats

	execs    []*execution                     // by start
	byInst   map[[2]int64][]*execution        // (pid, inst) -> executions in order
	acts     map[string][]runnerproc.Record   // entity -> activations by time
	releases map[[2]int64]runnerproc.Record   // (pid, inst) -> release record
	cps      map[[2]int64][]runnerproc.Record // (pid, inst) -> checkpoint records
	perPID   map[int][]runnerproc.Record      // pid -> its records in time order
	late     map[*execution]bool              // handlers that finished after their shard moved
	acked    map[*execution]bool              // handlers whose result a caller got as a success
}

func (c *checker) violate(format string, args ...any) {
	if len(c.violations) < 50 {
		c.violations = append(c.violations, fmt.Sprintf(format, args...))
	} else if len(c.violations) == 50 {
		c.violations = append(c.violations, "(more violations not listed)")
	}
}

// timing judges a timing rule missed by over: a bound that holds only if
// the processes doing the work get the CPU. When one of pids (every
// process when nil) went unscheduled for at least over within [from, to]
// (its stall probe, SIGSTOPs left out: they are faults with bounds of
// their own), the miss is what the starvation explains: it is reported in
// stats.Starved, not as a violation, and timing returns true. Otherwise it
// is a violation.
// Guarantees that do not depend on scheduling (single writer, fencing,
// no acknowledged late result, linearizability) never come here.
func (c *checker) timing(over time.Duration, pids []int, from, to int64, format string, args ...any) (starved bool) {
	pid, stalled := c.stalled(pids, from, to)
	if over > 0 && stalled >= over {
		c.st.Starved = append(c.st.Starved, fmt.Sprintf(format, args...)+
			fmt.Sprintf(" [starved: pid %d went unscheduled %v of that window, more than the %v over the bound]",
				pid, stalled.Round(time.Millisecond), over.Round(time.Millisecond)))
		return true
	}
	c.violate(format, args...)
	return false
}

// stalled returns the process of pids (every process when nil) that went
// unscheduled longest within [from, to], and how long, SIGSTOPs left out.
func (c *checker) stalled(pids []int, from, to int64) (int, time.Duration) {
	if pids == nil {
		for pid := range c.in.stalls {
			pids = append(pids, pid)
		}
	}
	worst, most := 0, time.Duration(0)
	for _, pid := range pids {
		var d time.Duration
		for _, s := range c.in.stalls[pid] {
			if !c.pausedWithin(pid, s[0], s[1]) {
				d += runnerproc.Stalls{s}.Within(from, to)
			}
		}
		if d > most {
			worst, most = pid, d
		}
	}
	return worst, most
}

func (c *checker) countStalls() {
	for pid, ss := range c.in.stalls {
		for _, s := range ss {
			if !c.pausedWithin(pid, s[0], s[1]) {
				d := time.Duration(s[1] - s[0])
				c.st.Stalls++
				c.st.StallTotal += d
				c.st.StallMax = max(c.st.StallMax, d)
			}
		}
	}
}

// convergence is check 7's bound: the cluster converged within 2 x TTL
// after the last fault was healed (its measure is the driver's, which
// polls every 100 ms and probes one counter of every shard).
func (c *checker) convergence() {
	if c.in.converged == 0 || c.in.lastHeal == 0 {
		return // never converged: the run reported it
	}
	took, limit := time.Duration(c.in.converged-c.in.lastHeal), 2*c.in.p.TTL
	if took > limit {
		c.timing(took-limit, nil, c.in.lastHeal, c.in.converged,
			"converged %v after the last fault was healed, more than 2 x TTL (%v)", took.Round(time.Millisecond), limit)
	}
}

func (c *checker) deathOf(pid int) int64 {
	if inc := c.in.incarnations[pid]; inc != nil && inc.killed != 0 {
		return inc.killed
	}
	return never
}

func (c *checker) pausedWithin(pid int, from, to int64) bool {
	inc := c.in.incarnations[pid]
	if inc == nil {
		return false
	}
	for _, p := range inc.pauses {
		if p[0] < to && p[1] > from {
			return true
		}
	}
	return false
}

// index groups the records.
func (c *checker) index() {
	hist := slices.Clone(c.in.history)
	sort.SliceStable(hist, func(i, j int) bool { return hist[i].Mono < hist[j].Mono })
	c.byInst = map[[2]int64][]*execution{}
	c.acts = map[string][]runnerproc.Record{}
	c.releases = map[[2]int64]runnerproc.Record{}
	c.cps = map[[2]int64][]runnerproc.Record{}
	c.perPID = map[int][]runnerproc.Record{}
	open := map[[2]int64]*execution{}
	for _, r := range hist {
		key := [2]int64{int64(r.PID), r.Inst}
		c.perPID[r.PID] = append(c.perPID[r.PID], r)
		switch r.Kind {
		case runnerproc.HistStart:
			x := &execution{pid: r.PID, runner: r.Runner, shard: r.Shard, epoch: r.Epoch, entity: r.Entity, inst: r.Inst,
				lease: r.Lease, deadline: r.Deadline, start: r.Mono, end: c.deathOf(r.PID)}
			if prev := open[key]; prev != nil {
				c.violate("instance %d of %s on %s (pid %d) started a handler at %s while one started at %s had not ended",
					r.Inst, r.Entity, r.Runner, r.PID, at(r.Mono), at(prev.start))
			}
			open[key] = x
			c.execs = append(c.execs, x)
			c.byInst[key] = append(c.byInst[key], x)
		case runnerproc.HistEnd:
			if x := open[key]; x != nil {
				x.end, x.ended, x.value, x.err = r.Mono, true, r.Value, r.Err
				x.tick = r.Detail == runnerproc.TickDetail
				delete(open, key)
			}
		case runnerproc.HistActivate:
			c.acts[r.Entity] = append(c.acts[r.Entity], r)
		case runnerproc.HistRelease:
			c.releases[key] = r
		case runnerproc.HistCheckpoint:
			c.cps[key] = append(c.cps[key], r)
		}
	}
	c.st.Handlers = len(c.execs)
}

// singleWriter is check 1.
func (c *checker) singleWriter() {
	byShard := map[int][]*execution{}
	for _, x := range c.execs {
		byShard[x.shard] = append(byShard[x.shard], x)
	}
	late := map[*execution]bool{}
	for shard, xs := range byShard {
		// xs is in start order. Compare each execution with the ones that
		// started before it ended, by a sweep keeping the open ones.
		var active []*execution
		for _, x := range xs {
			kept := active[:0]
			for _, a := range active {
				if a.end > x.start {
					kept = append(kept, a)
				}
			}
			active = kept
			for _, a := range active {
				if a.pid == x.pid && a.epoch == x.epoch {
					continue // one owner: its entities run concurrently
				}
				older := a
				if x.epoch < a.epoch {
					older = x
				}
				// Frozen while it ran, or between its admission and its
				// first record (a pause that ended just before the start:
				// the same window as check 6): a late handler, whose result
				// must never be acknowledged (check 5).
				if older.ended && c.pausedWithin(older.pid, older.start-int64(frozenBeforeStart), older.end) {
					late[older] = true
					continue
				}
				c.violate("shard %d executed by two owners at once: %s (pid %d, epoch %d) %s..%s and %s (pid %d, epoch %d) %s..%s",
					shard, a.runner, a.pid, a.epoch, at(a.start), atEnd(a.end), x.runner, x.pid, x.epoch, at(x.start), atEnd(x.end))
			}
			active = append(active, x)
		}
	}
	c.late = late
	c.st.LateHandlers = len(late)
	// SIGSTOPs and how many caught a handler running.
	for pid, inc := range c.in.incarnations {
		for _, p := range inc.pauses {
			c.st.Pauses++
			for _, x := range c.execs {
				if x.pid == pid && x.start < p[0] && x.end > p[0] {
					c.st.PausesHit++
					break
				}
			}
		}
	}
}

// epochsIncrease is check 2, over the runners' acquisitions.
func (c *checker) epochsIncrease() {
	type acq struct {
		mono  int64
		epoch int64
		who   string
	}
	byShard := map[int][]acq{}
	for _, r := range c.in.history {
		if r.Kind == runnerproc.HistAcquired {
			byShard[r.Shard] = append(byShard[r.Shard], acq{r.Mono, r.Epoch, fmt.Sprintf("%s (pid %d)", r.Runner, r.PID)})
		}
	}
	for shard, as := range byShard {
		sort.Slice(as, func(i, j int) bool { return as[i].mono < as[j].mono })
		for i := 1; i < len(as); i++ {
			if as[i].epoch < as[i-1].epoch || (as[i].epoch == as[i-1].epoch && as[i].who != as[i-1].who) {
				c.violate("shard %d: %s acquired epoch %d at %s after %s had acquired epoch %d at %s",
					shard, as[i].who, as[i].epoch, at(as[i].mono), as[i-1].who, as[i-1].epoch, at(as[i-1].mono))
			}
		}
	}
}

// fencedWrites is check 3: replays etcd's history of locks and checkpoints.
func (c *checker) fencedWrites() {
	lockEpoch := map[string]int64{} // shard -> ModRevision of its lock (0: none)
	for _, ev := range c.in.etcd {
		ks, rest, _ := strings.Cut(ev.Key, "/")
		switch ks {
		case "shards":
			if ev.Put {
				lockEpoch[rest] = ev.Rev
			} else {
				delete(lockEpoch, rest)
			}
		case "checkpoints":
			if !ev.Put {
				continue
			}
			shardStr, name, _ := strings.Cut(rest, "/")
			n, err := strconv.Atoi(shardStr)
			if err != nil {
				c.violate("checkpoint key %q: not a shard", ev.Key)
				continue
			}
			cp, err := storage.DecodeCheckpoint(sharding.ShardID(n), name, ev.Value, storage.Revision(ev.Rev))
			if err != nil {
				c.violate("checkpoint %q at revision %d: %v", ev.Key, ev.Rev, err)
				continue
			}
			c.st.AcceptedWrites++
			if cur := lockEpoch[shardStr]; int64(cp.Epoch) != cur {
				c.violate("stale write accepted: checkpoint %q at revision %d under epoch %d, the lock's epoch then was %d",
					ev.Key, ev.Rev, cp.Epoch, cur)
			}
		}
	}
	for _, rs := range c.cps {
		for _, r := range rs {
			if !r.OK && strings.Contains(r.Err, "fenced") {
				c.st.FencedWrites++
			}
		}
	}
}

// increments is check 4: follows each counter from instance to instance.
func (c *checker) increments() {
	maxAcked := map[[2]int64]int64{}
	ackedValues := map[[2]int64]map[int64]bool{}
	for _, a := range c.in.asks {
		if !a.OK {
			continue
		}
		key := [2]int64{int64(a.Resp.PID), a.Resp.Inst}
		maxAcked[key] = max(maxAcked[key], a.Resp.Value)
		if a.Get {
			continue
		}
		if ackedValues[key] == nil {
			ackedValues[key] = map[int64]bool{}
		}
		if ackedValues[key][a.Resp.Value] {
			c.violate("entity %s: two increments acknowledged with the same value %d by instance %d (pid %d)",
				entityID(a.Entity), a.Resp.Value, a.Resp.Inst, a.Resp.PID)
		}
		ackedValues[key][a.Resp.Value] = true
	}
	for ent, all := range c.acts {
		// An activation under an epoch older than one already activated
		// is a frozen process resuming between its admission check and
		// the entity's activation, after its shard moved on: not a
		// successor. Its handlers must never run (the runtime checks the
		// detach instant again after the activation).
		var acts []runnerproc.Record
		maxEpoch := int64(0)
		for _, a := range all {
			if int64(a.Epoch) < maxEpoch {
				c.st.StaleActivations++
				if xs := c.byInst[[2]int64{int64(a.PID), a.Inst}]; len(xs) > 0 {
					c.violate("entity %s: instance %d on %s activated under epoch %d after epoch %d had been, and ran %d handlers",
						ent, a.Inst, a.Runner, a.Epoch, maxEpoch, len(xs))
				}
				continue
			}
			maxEpoch = int64(a.Epoch)
			acts = append(acts, a)
		}
		for i := 0; i+1 < len(acts); i++ {
			prev, next := acts[i], acts[i+1]
			key := [2]int64{int64(prev.PID), prev.Inst}
			acked, ok := maxAcked[key]
			if !ok {
				acked = prev.Value
			}
			lastCP := prev.Value
			for _, r := range c.cps[key] {
				if r.OK {
					lastCP = max(lastCP, r.Value)
				}
			}
			rel, released := c.releases[key]
			switch {
			case released && rel.OK:
				c.st.PlannedMoves++
				if next.Value < acked {
					c.st.LostPlanned += acked - next.Value
					c.violate("entity %s: %d acknowledged increments lost on a planned move (instance %d on %s acknowledged %d and released %d; next instance on %s restored %d)",
						ent, acked-next.Value, prev.Inst, prev.Runner, acked, rel.Value, next.Runner, next.Value)
				}
			default:
				c.st.CrashMoves++
				if next.Value < lastCP {
					c.violate("entity %s: checkpointed state lost (instance %d on %s checkpointed %d; next instance on %s restored %d)",
						ent, prev.Inst, prev.Runner, lastCP, next.Runner, next.Value)
				}
				if acked > next.Value {
					c.st.LostCrash += acked - next.Value
				}
			}
		}
	}
}

// frozenBeforeStart: a handler whose first record came this soon after
// its process resumed from a SIGSTOP may have been admitted before the
// stop (checks 1 and 6 judge it as a late handler).
const frozenBeforeStart = 10 * time.Millisecond

// admitSlack is how long after the detach instant the first record of a
// handler admitted just before it may be written (check 6): the runtime
// checks the instant, then calls the handler, which records its start (12
// µs later in one run, 2 ms in another at load average 27; a goroutine
// can be preempted in between). Only for handlers whose result was not
// acknowledged; the margin (TTL/3) is what keeps them before the expiry.
const admitSlack = 50 * time.Millisecond

// resumeSlack is how much later than the process the parent may see a
// SIGCONT take effect (it polls /proc).
const resumeSlack = 50 * time.Millisecond
