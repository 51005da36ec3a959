package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
)

// The checks that compare events in time: no late reply acknowledged,
// detachment before the lease expired on etcd, health before re-attaching;
// and the asks' outcomes.

// lateReplies is check 5.
func (c *checker) lateReplies() {
	// The first start of each (entity, epoch) and of each shard epoch.
	firstStart := map[string]map[int64]int64{} // entity -> epoch -> first start
	for _, x := range c.execs {
		m := firstStart[x.entity]
		if m == nil {
			m = map[int64]int64{}
			firstStart[x.entity] = m
		}
		if s, ok := m[x.epoch]; !ok || x.start < s {
			m[x.epoch] = x.start
		}
	}
	acked := map[*execution]bool{}
	c.acked = acked
	for _, a := range c.in.asks {
		if !a.OK {
			continue
		}
		xs := c.byInst[[2]int64{int64(a.Resp.PID), a.Resp.Inst}]
		var x *execution
		for _, y := range xs { // the last execution that ended before the reply with this value
			if y.ended && y.end <= a.Done && y.value == a.Resp.Value && y.err == "" && !y.tick {
				x = y
			}
		}
		if x == nil {
			c.violate("entity %s: reply (value %d, pid %d, instance %d, epoch %d) matches no handler execution",
				entityID(a.Entity), a.Resp.Value, a.Resp.PID, a.Resp.Inst, a.Resp.Epoch)
			continue
		}
		acked[x] = true
		for ep, s := range firstStart[x.entity] {
			if ep > x.epoch && s < x.end {
				c.violate("late reply acknowledged: entity %s, handler on %s (pid %d, epoch %d) ended at %s, after epoch %d had started serving it at %s; value %d",
					x.entity, x.runner, x.pid, x.epoch, at(x.end), ep, at(s), x.value)
			}
		}
	}
	for x := range c.late {
		if !acked[x] {
			c.st.LateWithheld++
		}
	}
}

// detachBeforeExpiry is check 6.
func (c *checker) detachBeforeExpiry() {
	// Leases of each process (registered/re-attached) and the server-side
	// end of each lease: the revision deleting a runner key under it.
	holder := map[int64]int{} // lease -> pid
	for pid, recs := range c.perPID {
		for _, r := range recs {
			if r.Kind == runnerproc.HistRegistered || r.Kind == runnerproc.HistReattached {
				holder[r.Lease] = pid
			}
			if r.Kind == runnerproc.HistDetached {
				c.st.Detaches++
			}
		}
	}
	ended := map[int64]int64{} // lease -> Mono when its deletion was seen
	for _, ev := range c.in.etcd {
		if ev.Put || ev.PrevLease == 0 || !strings.HasPrefix(ev.Key, "runners/") {
			continue
		}
		if _, ok := ended[ev.PrevLease]; ok {
			continue
		}
		if seen := c.in.deleteSeen(ev.Rev); seen != 0 {
			ended[ev.PrevLease] = seen
		}
	}
	for lease, endAt := range ended {
		pid, ok := holder[lease]
		if !ok {
			continue
		}
		inc := c.in.incarnations[pid]
		if inc == nil || (inc.killed != 0 && inc.killed < endAt) || (inc.termSent != 0 && inc.termSent < endAt) {
			continue // a crash (expiry of a dead process's lease) or a revocation by Shutdown
		}
		c.st.Expiries++
		// The process's detach for this lease: its first Detached record
		// after the last time it attached under the lease before the
		// expiry (a runner that detached and re-attached under the same
		// lease earlier had a detach of its own then).
		attached := -1
		recs := c.perPID[pid]
		for i, r := range recs {
			if r.Mono >= endAt {
				break
			}
			if (r.Kind == runnerproc.HistRegistered || r.Kind == runnerproc.HistReattached) && r.Lease == lease {
				attached = i
			}
		}
		var det *runnerproc.Record
		for i := attached + 1; attached >= 0 && i < len(recs); i++ {
			if recs[i].Kind == runnerproc.HistDetached {
				det = &recs[i]
				break
			}
		}
		if det == nil {
			c.violate("lease %x of %s (pid %d) expired on the server at %s and its runner never detached", lease, inc.id, pid, at(endAt))
			continue
		}
		instant := det.Mono
		if det.Deadline != 0 {
			instant = min(instant, det.Deadline-int64(c.margin))
		}
		c.st.DetachMargins = append(c.st.DetachMargins, time.Duration(endAt-instant))
		if instant >= endAt {
			c.violate("%s (pid %d) detached at %s (deadline %s - margin), not before its lease %x expired on the server at %s",
				inc.id, pid, at(instant), at(det.Deadline), lease, at(endAt))
		}
	}
	for _, x := range c.execs {
		frozen := c.pausedWithin(x.pid, x.start-int64(frozenBeforeStart), x.start)
		if x.deadline != 0 && x.start >= x.deadline-int64(c.margin) {
			if frozen {
				c.st.Ambiguous++
				continue
			}
			instant := x.deadline - int64(c.margin)
			if x.start-instant < int64(admitSlack) && !c.acked[x] {
				// Admitted just before the instant: the runtime's check and
				// the handler's first record cannot be simultaneous. Its
				// result must not be acknowledged (the owner's check after
				// the handler withholds it), and it is counted.
				c.st.AdmittedAtInstant++
				continue
			}
			const format = "handler of %s on %s (pid %d, epoch %d) started at %s, after the detach instant %s"
			if c.acked[x] {
				// An acknowledged result from past the instant: a violation
				// however late its process ran.
				c.violate(format, x.entity, x.runner, x.pid, x.epoch, at(x.start), at(instant))
				continue
			}
			// Admitted before the instant (the runtime checks it first),
			// its start recorded more than admitSlack after it: excused
			// only by as much stall after the instant, when the handler
			// had certainly been admitted — and then a start recorded
			// after the lease expired on the server is as late a record.
			if c.timing(time.Duration(x.start-instant)-admitSlack, []int{x.pid}, instant, x.start,
				format, x.entity, x.runner, x.pid, x.epoch, at(x.start), at(instant)) {
				continue
			}
		}
		if endAt, ok := ended[x.lease]; ok && x.start >= endAt {
			if frozen {
				c.st.Ambiguous++
				continue
			}
			c.violate("handler of %s on %s (pid %d, epoch %d) started at %s, after its lease %x expired on the server at %s",
				x.entity, x.runner, x.pid, x.epoch, at(x.start), x.lease, at(endAt))
		}
	}
}

// healthBeforeReattach is part of check 6: a detached runner re-attaches
// only after RecoverWindow (the default, TTL/3) of health it observed; a
// SIGSTOP is not health, so every pause that ended after the detach must
// end at least RecoverWindow before the re-attachment.
func (c *checker) healthBeforeReattach() {
	window := int64(c.in.p.TTL / 3)
	for pid, recs := range c.perPID {
		inc := c.in.incarnations[pid]
		if inc == nil {
			continue
		}
		detachedAt := int64(-1)
		for _, r := range recs {
			switch r.Kind {
			case runnerproc.HistDetached:
				if detachedAt < 0 {
					detachedAt = r.Mono
				}
			case runnerproc.HistRegistered, runnerproc.HistReattached:
				if detachedAt < 0 {
					continue
				}
				for _, p := range inc.pauses {
					if p[1] > detachedAt-window && p[1] <= r.Mono && r.Mono-p[1] < window-int64(resumeSlack) {
						c.violate("%s (pid %d) re-attached at %s, %v after a SIGSTOP ended (%s): less than RecoverWindow (%v) of health",
							inc.id, pid, at(r.Mono), time.Duration(r.Mono-p[1]).Round(time.Millisecond), at(p[1]), time.Duration(window))
					}
				}
				if r.Kind == runnerproc.HistReattached {
					detachedAt = -1
				}
			}
		}
	}
}

func (c *checker) countAsks() {
	for _, a := range c.in.asks {
		if a.OK {
			c.st.AsksOK++
		} else {
			c.st.AsksFailed[a.Class]++
			if _, ok := c.st.Examples[a.Class]; !ok {
				c.st.Examples[a.Class] = a.Err
			}
		}
	}
}

// at formats a Mono instant as seconds (relative instants are easier to
// read than raw nanoseconds; all come from the same clock).
func at(mono int64) string { return fmt.Sprintf("%.3fs", float64(mono)/1e9) }

func atEnd(mono int64) string {
	if mono == never {
		return "(never ended)"
	}
	return at(mono)
}
