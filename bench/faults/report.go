package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
)

// line is a run's one-line outcome.
func (r *result) line() string {
	st := r.Stats
	var b strings.Builder
	switch {
	case r.Err != nil:
		fmt.Fprintf(&b, "ERROR (%v): %v", r.Took.Round(time.Second), r.Err)
	case len(r.Violations) > 0:
		fmt.Fprintf(&b, "FAIL %d violations (%v)", len(r.Violations), r.Took.Round(time.Second))
	default:
		fmt.Fprintf(&b, "ok (%v)", r.Took.Round(time.Second))
	}
	if r.Err == nil {
		fmt.Fprintf(&b, ": asks %d ok / %d failed, handlers %d, pauses %d (hit a handler %d, late handlers %d, withheld %d), lost planned %d / crash %d, fenced %d, detaches %d, reminder ticks %d (%d redelivered), converged %v",
			st.AsksOK, st.failedTotal(), st.Handlers, st.Pauses, st.PausesHit, st.LateHandlers, st.LateWithheld,
			st.LostPlanned, st.LostCrash, st.FencedWrites, st.Detaches, st.ReminderFires, st.ReminderRedelivered, r.Converge.Round(time.Millisecond))
		fmt.Fprintf(&b, ", register operations checked %d (%d pending) in %v", st.Lin.Ops, st.Lin.Pending, st.Lin.Took.Round(time.Millisecond))
		fmt.Fprintf(&b, ", always-on runs %d / lives %d (two at once %d, fenced-only %d)", st.Always.Runs, st.Always.Lives, st.Always.Overlaps, st.Always.FencedOnly)
		fmt.Fprintf(&b, ", stalls %d (longest %v), bounds missed starved %d", st.Stalls, st.StallMax.Round(time.Millisecond), len(st.Starved))
	}
	if r.Dir != "" {
		fmt.Fprintf(&b, "; files in %s", r.Dir)
	}
	return b.String()
}

// summary adds up a session's runs.
type summary struct {
	p          params
	runs       int
	errs       []string
	violations []string
	starved    []string // timing bounds missed by starved processes (not violations)
	faults     map[string]int
	st         stats
	converge   []time.Duration
	took       time.Duration
	seeds      []uint64
}

func newSummary(p params) *summary {
	return &summary{p: p, faults: map[string]int{}, st: stats{AsksFailed: map[string]int{}, Examples: map[string]string{}}}
}

func (s *summary) add(r *result) {
	s.runs++
	s.took += r.Took
	s.seeds = append(s.seeds, r.Seed)
	if r.Err != nil {
		s.errs = append(s.errs, fmt.Sprintf("seed %d: %v", r.Seed, r.Err))
	}
	for _, v := range r.Violations {
		s.violations = append(s.violations, fmt.Sprintf("seed %d: %s", r.Seed, v))
	}
	st := r.Stats
	for k, v := range st.Faults {
		s.faults[k] += v
	}
	s.st.AsksOK += st.AsksOK
	s.st.AsksShed += st.AsksShed
	for k, v := range st.AsksFailed {
		s.st.AsksFailed[k] += v
	}
	for k, v := range st.Examples {
		if _, ok := s.st.Examples[k]; !ok {
			s.st.Examples[k] = v
		}
	}
	s.st.Handlers += st.Handlers
	s.st.Pauses += st.Pauses
	s.st.PausesHit += st.PausesHit
	s.st.LateHandlers += st.LateHandlers
	s.st.LateWithheld += st.LateWithheld
	s.st.LostPlanned += st.LostPlanned
	s.st.LostCrash += st.LostCrash
	s.st.PlannedMoves += st.PlannedMoves
	s.st.CrashMoves += st.CrashMoves
	s.st.FencedWrites += st.FencedWrites
	s.st.AcceptedWrites += st.AcceptedWrites
	s.st.Expiries += st.Expiries
	s.st.Detaches += st.Detaches
	s.st.Ambiguous += st.Ambiguous
	s.st.AdmittedAtInstant += st.AdmittedAtInstant
	s.st.StaleActivations += st.StaleActivations
	s.st.DetachMargins = append(s.st.DetachMargins, st.DetachMargins...)
	s.st.ReminderFires += st.ReminderFires
	s.st.ReminderRedelivered += st.ReminderRedelivered
	s.st.ReminderRecovery = append(s.st.ReminderRecovery, st.ReminderRecovery...)
	s.st.ReminderResume = append(s.st.ReminderResume, st.ReminderResume...)
	s.st.Lin.Add(st.Lin)
	s.st.Always.add(st.Always)
	for _, m := range st.Starved {
		s.starved = append(s.starved, fmt.Sprintf("seed %d: %s", r.Seed, m))
	}
	s.st.Stalls += st.Stalls
	s.st.StallTotal += st.StallTotal
	s.st.StallMax = max(s.st.StallMax, st.StallMax)
	if r.Converge >= 0 {
		s.converge = append(s.converge, r.Converge)
	}
}

func (s *summary) failed() bool { return len(s.errs) > 0 || len(s.violations) > 0 }

func dist(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	q := func(f float64) time.Duration { return ds[int(f*float64(len(ds)-1))] }
	r := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	return fmt.Sprintf("min %v / p50 %v / max %v (%d)", r(ds[0]), r(q(0.5)), r(ds[len(ds)-1]), len(ds))
}

// quantiles is p50 / p99 / max of ds, with their count.
func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	q := func(f float64) time.Duration { return ds[int(f*float64(len(ds)-1))].Round(time.Millisecond) }
	return fmt.Sprintf("p50 %v / p99 %v / max %v (%d)", q(0.5), q(0.99), q(1), len(ds))
}

func (s *summary) print(w io.Writer) {
	p := s.p
	fmt.Fprintf(w, "\nfaults: %d runs (seeds %d..%d), %d runner processes at start, %d shards, %d counters, %d asks/s, TTL %v, %v handlers, checkpoint every %d; %v in all\n",
		s.runs, s.seeds[0], s.seeds[len(s.seeds)-1], p.Runners, p.Shards, p.Entities, p.Rate, p.TTL, p.Work, p.CheckpointEvery, s.took.Round(time.Second))
	var kinds []string
	total := 0
	for _, k := range faultKinds {
		if n := s.faults[k]; n > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
			total += n
		}
	}
	fmt.Fprintf(w, "faults injected: %d (%s)\n", total, strings.Join(kinds, ", "))
	st := s.st
	fmt.Fprintf(w, "runner SIGSTOPs: %d, %d while a handler ran; handlers that finished after their shard moved: %d, results withheld %d, acknowledged %d\n",
		st.Pauses, st.PausesHit, st.LateHandlers, st.LateWithheld, st.LateHandlers-st.LateWithheld)
	var classes []string
	for _, k := range []string{classMaybe, classStale, classDeadline, classNoOwner, classNotOwner, classOther} {
		classes = append(classes, fmt.Sprintf("%s %d", k, st.AsksFailed[k]))
	}
	fmt.Fprintf(w, "asks: %d ok, %d failed (%s), %d not sent (too many waiting); %d handler executions recorded\n",
		st.AsksOK, st.failedTotal(), strings.Join(classes, ", "), st.AsksShed, st.Handlers)
	for _, k := range []string{classMaybe, classStale, classDeadline, classNoOwner, classNotOwner, classOther} {
		if e, ok := st.Examples[k]; ok {
			fmt.Fprintf(w, "  e.g. %s: %s\n", k, e)
		}
	}
	fmt.Fprintf(w, "acknowledged increments lost: %d in %d planned moves, %d in %d moves after a crash or detach (not yet checkpointed)\n",
		st.LostPlanned, st.PlannedMoves, st.LostCrash, st.CrashMoves)
	fmt.Fprintf(w, "checkpoint writes: %d accepted by etcd (each under the lock's epoch at its revision), %d rejected by fencing\n", st.AcceptedWrites, st.FencedWrites)
	fmt.Fprintf(w, "detaches: %d; leases expired on the server while their runner lived: %d; expiry - detach instant: %s\n", st.Detaches, st.Expiries, dist(st.DetachMargins))
	if st.StaleActivations > 0 {
		fmt.Fprintf(w, "activations under a superseded epoch (a frozen process resuming mid-activation), none running a handler: %d\n", st.StaleActivations)
	}
	if st.AdmittedAtInstant > 0 {
		fmt.Fprintf(w, "handlers admitted just before the detach instant, started (first record) < %v after it, result withheld: %d\n", admitSlack, st.AdmittedAtInstant)
	}
	if st.Ambiguous > 0 {
		fmt.Fprintf(w, "handler starts a SIGSTOP may have separated from their admission (not judged): %d\n", st.Ambiguous)
	}
	fmt.Fprintf(w, "reminders (%d counters, every %v): %d ticks fired, %d redelivered after an unplanned loss; fired again after a SIGKILL of their runner (worst per kill): %s (limit 2 x TTL); first fire after the convergence: %s (limit %v)\n",
		min(p.Reminders, p.Entities), reminderPeriod, st.ReminderFires, st.ReminderRedelivered, dist(st.ReminderRecovery), quantiles(st.ReminderResume), reminderPeriod+reminderResume)
	fmt.Fprintf(w, "converged after the last fault: %s (limit 2 x TTL = %v)\n", dist(s.converge), 2*p.TTL)
	fmt.Fprintf(w, "registers (%d, %d operations/s): %s\n", p.Registers, p.RegisterRate, st.Lin)
	a := st.Always
	fmt.Fprintf(w, "always-on (%d singletons, a worker per shard, %d remembered keepers): %d runs and %d lives recorded; two at once: %d; fenced-only (the older on a process frozen past its detach instant): %d, returned after the SIGCONT was seen: %s; started with their context ended: %d; starts after a SIGSTOP not judged: %d; keepers touched right before a graceful stop: %d checked to run at the end, %d not (their shard lost unplanned after)\n",
		p.Singletons, p.Keepers, a.Runs, a.Lives, a.Overlaps, a.FencedOnly, dist(a.Resumed), a.Stillborn, a.Ambiguous, a.Late, a.LateExcused)
	fmt.Fprintf(w, "always-on running again (limit 2 x TTL = %v; after a detach from the return, the limit counting from the fault's heal when later):\n", 2*p.TTL)
	for _, cause := range againCauses {
		parts := make([]string, 0, len(againKinds))
		for _, kind := range againKinds {
			parts = append(parts, kind+" "+quantiles(a.Again[again{cause, kind}]))
		}
		fmt.Fprintf(w, "  after %s: %s\n", cause, strings.Join(parts, "; "))
	}
	fmt.Fprintf(w, "processes unscheduled for %v or more (stall probes, SIGSTOPs left out): %d times, %v in all, the longest %v\n",
		testenv.StallMin, st.Stalls, st.StallTotal.Round(time.Millisecond), st.StallMax.Round(time.Millisecond))
	fmt.Fprintf(w, "timing bounds missed by a process measurably starved meanwhile (reported, not violations): %d\n", len(s.starved))
	for _, m := range s.starved {
		fmt.Fprintln(w, "  STARVED: "+m)
	}
	fmt.Fprintf(w, "violations: %d\n", len(s.violations))
	for _, v := range s.violations {
		fmt.Fprintln(w, "  "+v)
	}
	if len(s.errs) > 0 {
		fmt.Fprintf(w, "runs that could not be carried out: %d\n", len(s.errs))
		for _, e := range s.errs {
			fmt.Fprintln(w, "  "+e)
		}
	}
	if !s.failed() {
		fmt.Fprintln(w, "OK")
	}
}
