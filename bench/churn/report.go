package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/runner/runnertest/ownership"
	"github.com/shardhost/shardhost/sharding"
)

// Classes of failed asks.
const (
	classMaybeDelivered = "ErrMaybeDelivered"
	classNotOwner       = "*NotOwnerError"
	classUndelivered    = "*UndeliveredError"
	classDeadline       = "context deadline"
	classOther          = "other"
)

var classes = []string{classMaybeDelivered, classNotOwner, classUndelivered, classDeadline, classOther}

// classify names the class of a failed ask. The order matters: a timeout
// after sending wraps ErrMaybeDelivered and the deadline, and a send that
// was retried until its deadline wraps the deadline and its last attempt's
// error (often a *NotOwnerError): it counts as a deadline.
func classify(err error) string {
	var (
		no *runner.NotOwnerError
		ud *runner.UndeliveredError
	)
	switch {
	case errors.Is(err, runner.ErrMaybeDelivered):
		return classMaybeDelivered
	case errors.Is(err, context.DeadlineExceeded):
		return classDeadline
	case errors.As(err, &no):
		return classNotOwner
	case errors.As(err, &ud):
		return classUndelivered
	default:
		return classOther
	}
}

// Windows an ask is attributed to: the churn step windows (from the step's
// start, or crash instant, to the cluster settled again) it was in flight
// during, a crash window first; steady otherwise.
const (
	winSteady  = "steady"
	winPlanned = "planned"
	winCrash   = "crash"
)

var windows = []string{winSteady, winPlanned, winCrash}

// Dist is a distribution of durations, in milliseconds.
type Dist struct {
	N   int     `json:"n"`
	P50 float64 `json:"p50_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
}

func distOf(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	slices.Sort(ds)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return Dist{N: len(ds), P50: ms(ds[len(ds)/2]), P99: ms(ds[len(ds)*99/100]), Max: ms(ds[len(ds)-1])}
}

// StepReport is one churn step.
type StepReport struct {
	Kind         string   `json:"kind"`
	Runner       string   `json:"runner"`
	At           float64  `json:"at_s"`    // since the churn began
	Settled      bool     `json:"settled"` // within settleTimeout
	Settle       float64  `json:"settle_ms"`
	RunnersAfter int      `json:"runners_after"`
	Cost         StepCost `json:"cost"`
}

// AskReport sums up the asks.
type AskReport struct {
	OK       int               `json:"ok"`
	Failed   map[string]int    `json:"failed"`           // by class
	FailedIn map[string]int    `json:"failed_by_window"` // by window
	Latency  map[string]Dist   `json:"latency"`          // successful asks: "all" and by window
	Samples  map[string]string `json:"samples,omitempty"`
}

// Report is everything a run measured.
type Report struct {
	Params    ParamsReport `json:"params"`
	Etcd      string       `json:"etcd"`
	Measured  float64      `json:"measured_s"`    // churn start to the end of the load
	ColdStart float64      `json:"cold_start_ms"` // the first runners started -> every shard owned (or the cold start given up)
	// ColdDone: every shard was owned within -coldtimeout; else the run
	// ended there, and ColdProgress says how far it got.
	ColdDone bool `json:"cold_start_done"`
	// The first runners started -> the last of them registered (0: not
	// followed, as with -procs); what the cold start cost (Moved: 0).
	ColdRegistered float64  `json:"cold_last_registered_ms,omitempty"`
	ColdCost       StepCost `json:"cold_start_cost"`
	// The first runners started -> every owned shard's reminders and
	// remembered entities read (0: not followed, as with -procs), and
	// what the cold start cost until then.
	ColdLoaded     float64             `json:"cold_state_loaded_ms,omitempty"`
	ColdLoadedCost *StepCost           `json:"cold_state_loaded_cost,omitempty"`
	ColdProgress   []ColdSample        `json:"cold_start_progress,omitempty"` // a sample every -progress
	Steady         *SteadyReport       `json:"steady,omitempty"`
	Steps          []StepReport        `json:"steps"`
	StepCounts     map[string]int      `json:"step_counts"`
	Settle         map[string]Dist     `json:"settle_by_kind"`
	StepCost       map[string]StepCost `json:"step_cost_by_kind"` // medians of the settled steps' costs
	Between        *BetweenSteps       `json:"between_steps,omitempty"`
	Cutover        map[string]Dist     `json:"cutover"` // "planned", "crash"
	Phases         map[string]int      `json:"handoff_phases"`
	// Aborts: the aborted phase events by step kind, side ("new owner"
	// or "old owner") and reason (the event's Detail, numbers elided).
	Aborts map[string]int `json:"handoff_aborts_by_reason"`
	// Detaches: every Detached event of the run (the cold start's too),
	// by step kind and reason.
	Detaches        map[string]int `json:"detaches_by_reason"`
	Asks            AskReport      `json:"asks"`
	DoubleOwnership int            `json:"double_ownership"`
	LostNotCrash    int            `json:"shards_lost_outside_crashes"`
	// Crash steps: shards whose probe no new owner answered within the
	// step (Cutover["crash-first-ask"] has the others).
	FirstAskUnanswered int      `json:"crash_first_ask_unanswered"`
	Problems           []string `json:"problems"`

	timeline *timeline // the series writeHTML draws
}

// ParamsReport is Params as reported.
type ParamsReport struct {
	Runners  int     `json:"runners"`
	Shards   int     `json:"shards"`
	TTL      float64 `json:"ttl_s"`
	Callers  int     `json:"callers"`
	Entities int     `json:"entities"`
	Duration float64 `json:"duration_s"`
	Every    float64 `json:"every_s"`
	Steps    int     `json:"steps_limit,omitempty"`
	Crash    bool    `json:"crash"`
	Seed     uint64  `json:"seed"`
	Procs    bool    `json:"procs,omitempty"`
	// InProcessLoad: the gateway and callers ran in the harness's process
	// (-loadproc=false), their CPU counted with the runners'.
	InProcessLoad bool `json:"in_process_load,omitempty"`
	Burst         int  `json:"burst,omitempty"`
}

// failed is the number of failed asks.
func (a AskReport) failed() int {
	n := 0
	for _, v := range a.Failed {
		n += v
	}
	return n
}

// analyze turns the recorded events, steps and asks into the report.
func (h *harness) analyze(churnStart, end, loadBegan time.Time, asks []askRec, samples map[string]string) *Report {
	p := h.p
	rep := &Report{
		Params: ParamsReport{
			Runners: p.Runners, Shards: p.Shards, TTL: p.TTL.Seconds(), Callers: p.Callers, Entities: p.Entities,
			Duration: p.Duration.Seconds(), Every: p.Every.Seconds(), Steps: p.Steps, Crash: p.Crash, Seed: p.Seed, Procs: p.Procs, Burst: p.Burst,
			InProcessLoad: p.InProcessLoad,
		},
		Etcd:           h.etcd.Source,
		Measured:       end.Sub(churnStart).Seconds(),
		ColdStart:      float64(h.coldStart.Microseconds()) / 1000,
		ColdDone:       h.coldDone,
		ColdRegistered: float64(h.coldRegistered.Microseconds()) / 1000,
		ColdCost:       h.coldCost,
		ColdLoaded:     float64(h.coldLoaded.Microseconds()) / 1000,
		ColdProgress:   h.coldProgress,
		StepCounts:     map[string]int{},
		Settle:         map[string]Dist{},
		StepCost:       map[string]StepCost{},
		Cutover:        map[string]Dist{},
		Phases:         map[string]int{},
		Aborts:         map[string]int{},
		Detaches:       map[string]int{},
		Problems:       slices.Clone(h.problems),
	}
	if h.coldLoaded > 0 {
		rep.ColdLoadedCost = &h.coldLoadedCost
	}
	evs := h.rec.all()
	inRun := func(t time.Time) bool { return !t.Before(churnStart) && !t.After(end) }
	wins, lost := cutovers(evs, h.crashes, inRun)
	movedBy := movedPerStep(h.steps, wins)
	settle := map[string][]time.Duration{}
	costs := map[string][]StepCost{}
	for i, s := range h.steps {
		s.cost.setMoved(movedBy[i])
		sr := StepReport{Kind: s.Kind, Runner: s.Runner, At: s.start.Sub(churnStart).Seconds(), RunnersAfter: s.After, Cost: s.cost}
		rep.StepCounts[s.Kind]++
		if !s.settled.IsZero() { // else reported as a problem already
			d := s.settled.Sub(s.start)
			sr.Settled, sr.Settle = true, float64(d.Microseconds())/1000
			settle[s.Kind] = append(settle[s.Kind], d)
			costs[s.Kind] = append(costs[s.Kind], s.cost)
		}
		rep.Steps = append(rep.Steps, sr)
	}
	for k, ds := range settle {
		rep.Settle[k] = distOf(ds)
		rep.StepCost[k] = medianCost(costs[k])
	}

	if h.p.Steady > 0 {
		rep.Steady = &h.steady
	}
	if h.between.Window > 0 {
		rep.Between = &h.between
	}
	rep.DoubleOwnership = len(ownership.Overlaps(evs))
	var planned, crash []time.Duration
	for _, w := range wins {
		if w.crash {
			crash = append(crash, w.end.Sub(w.start))
		} else {
			planned = append(planned, w.end.Sub(w.start))
		}
	}
	rep.Cutover["planned"], rep.Cutover["crash"] = distOf(planned), distOf(crash)
	var first, routed, served []time.Duration
	first, routed, served, rep.FirstAskUnanswered = firstAskAfterAcquired(h.firstAsks, wins)
	rep.Cutover["crash-first-ask"] = distOf(first)
	rep.Cutover["crash-first-ask-routed"], rep.Cutover["crash-first-ask-served"] = distOf(routed), distOf(served)
	// Where a planned cutover's time goes: the old owner's release to its
	// lock transfer committed (its PhaseCutover), and that to the new
	// owner's ShardAcquired (the watch event and the install).
	moved := map[sharding.ShardID][]time.Time{} // the old owners' PhaseCutover instants
	for _, ev := range evs {
		if p, ok := ev.(runner.HandoffPhase); ok && p.Phase == runner.PhaseCutover && p.Runner == p.From {
			moved[p.Shard] = append(moved[p.Shard], p.Time)
		}
	}
	var transfer, install []time.Duration
	for _, w := range wins {
		if w.crash {
			continue
		}
		for _, at := range moved[w.shard] {
			if !at.Before(w.start) && !at.After(w.end) {
				transfer, install = append(transfer, at.Sub(w.start)), append(install, w.end.Sub(at))
				break
			}
		}
	}
	rep.Cutover["planned-transfer"], rep.Cutover["planned-install"] = distOf(transfer), distOf(install)
	rep.LostNotCrash = lost
	for _, ph := range []string{runner.PhaseWarming, runner.PhaseReady, runner.PhaseDrained, runner.PhaseCutover, runner.PhaseAborted} {
		rep.Phases[ph] = 0
	}
	for _, ev := range evs {
		switch e := ev.(type) {
		case runner.HandoffPhase:
			if inRun(e.Time) {
				rep.Phases[e.Phase]++
				if e.Phase == runner.PhaseAborted {
					rep.Aborts[h.stepKindAt(e.Time)+", "+abortKey(e)]++
				}
			}
		case runner.Detached:
			rep.Detaches[h.stepKindAt(e.Time)+", "+e.Reason.String()]++
		}
	}

	rep.Asks = h.askReport(loadBegan, end, asks, samples)
	if rep.DoubleOwnership != 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d double-ownership violations", rep.DoubleOwnership))
	}
	if n := rep.Asks.FailedIn[winPlanned]; n != 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d asks failed during planned moves", n))
	}
	if rep.FirstAskUnanswered != 0 {
		rep.Problems = append(rep.Problems, fmt.Sprintf("%d shards lost in crashes were not answered by a new owner within %v of the step settling", rep.FirstAskUnanswered, probeWait))
	}
	if len(h.steps) == 0 && h.coldDone {
		rep.Problems = append(rep.Problems, "no churn step happened (duration shorter than -every?)")
	}
	return rep
}

// askReport classifies the asks by outcome and window.
func (h *harness) askReport(loadBegan, end time.Time, asks []askRec, samples map[string]string) AskReport {
	type window struct {
		kind       string
		start, end time.Duration // since the load began
	}
	var wins []window
	for _, s := range h.steps {
		kind := winPlanned
		if s.Kind == stepCrash {
			kind = winCrash
		}
		settled := s.settled
		if settled.IsZero() {
			settled = end // did not settle: the window lasts to the end
		}
		wins = append(wins, window{kind, s.start.Sub(loadBegan), settled.Sub(loadBegan)})
	}
	ar := AskReport{Failed: map[string]int{}, FailedIn: map[string]int{}, Latency: map[string]Dist{}, Samples: samples}
	for _, c := range classes {
		ar.Failed[c] = 0
	}
	for _, w := range windows {
		ar.FailedIn[w] = 0
	}
	lat := map[string][]time.Duration{}
	for _, a := range asks {
		win := winSteady
		for _, w := range wins {
			if a.at < w.end && a.at+a.dur > w.start {
				if win = w.kind; win == winCrash {
					break
				}
			}
		}
		if a.class != 0 {
			ar.Failed[classes[a.class-1]]++
			ar.FailedIn[win]++
			continue
		}
		ar.OK++
		lat["all"] = append(lat["all"], a.dur)
		lat[win] = append(lat[win], a.dur)
	}
	for k, ds := range lat {
		ar.Latency[k] = distOf(ds)
	}
	return ar
}

// cutovers returns the window of every ownership change that ends inside
// the run: planned (the old owner's ShardReleased to another runner's
// ShardAcquired of the shard) and crash takeovers (the crash instant to the
// next ShardAcquired of a shard the crashed runner lost when it was
// closed). lost counts the ShardLost events that were not a crash.
func cutovers(evs []runner.Event, crashes map[string]time.Time, inRun func(time.Time) bool) (wins []cutoverWin, lost int) {
	type gone struct {
		at     time.Time
		runner string
		crash  bool
	}
	ended := map[sharding.ShardID]gone{}
	for _, ev := range evs {
		switch e := ev.(type) {
		case runner.ShardReleased:
			ended[e.Shard] = gone{e.Time, e.Runner, false}
		case runner.ShardLost:
			if at, ok := crashes[e.Runner]; ok && !e.Time.Before(at) {
				ended[e.Shard] = gone{at, e.Runner, true}
				continue
			}
			delete(ended, e.Shard)
			if inRun(e.Time) {
				lost++
			}
		case runner.ShardAcquired:
			g, ok := ended[e.Shard]
			delete(ended, e.Shard)
			if !ok || g.runner == e.Runner || !inRun(g.at) || !inRun(e.Time) {
				continue
			}
			wins = append(wins, cutoverWin{shard: e.Shard, from: g.runner, to: e.Runner, start: g.at, end: e.Time, crash: g.crash})
		}
	}
	return wins, lost
}

// movedPerStep counts the ownership changes of wins by step: each counts
// for the step under way when it completed (the last one begun by then;
// none before the first step).
func movedPerStep(steps []step, wins []cutoverWin) []int {
	moved := make([]int, len(steps))
	for _, w := range wins {
		i, _ := slices.BinarySearchFunc(steps, w.end, func(s step, t time.Time) int {
			if s.start.After(t) {
				return 1
			}
			return -1
		})
		if i > 0 {
			moved[i-1]++
		}
	}
	return moved
}

// firstAskAfterAcquired returns, for each probe answered, the time from
// its shard's takeover (the new owner's ShardAcquired after the crash) to
// the answer (0 when the answer came first: the owner's event is stamped
// after its install, which an ask can overtake) and, split, the takeover
// to the gateway's view naming the new owner (routed) and that to the
// answer (served); and how many probes were not answered.
func firstAskAfterAcquired(probes []firstAsk, wins []cutoverWin) (ds, routed, served []time.Duration, unanswered int) {
	type key struct {
		shard sharding.ShardID
		crash int64 // the crash instant, in Unix ns (a probe's came through the load child: no monotonic reading)
	}
	acquired := map[key]time.Time{}
	for _, w := range wins {
		if w.crash {
			acquired[key{w.shard, w.start.UnixNano()}] = w.end
		}
	}
	for _, p := range probes {
		at, ok := acquired[key{p.shard, p.crashAt.UnixNano()}]
		switch {
		case p.answered.IsZero():
			unanswered++
		case ok:
			ds = append(ds, max(0, p.answered.Sub(at)))
			if !p.routed.IsZero() {
				routed = append(routed, max(0, p.routed.Sub(at)))
				served = append(served, max(0, p.answered.Sub(p.routed)))
			}
		}
	}
	return ds, routed, served, unanswered
}

// cutoverWin is one ownership change: the shard left from at start (its
// release, or the crash instant) and to acquired it at end.
type cutoverWin struct {
	shard      sharding.ShardID
	from, to   string
	start, end time.Time
	crash      bool
}

// print writes the report as tables.
func (rep *Report) print(w io.Writer) {
	p := rep.Params
	if p.Burst > 0 {
		fmt.Fprintf(w, "\nchurn: %d runners at start, bursts of %d joining or leaving within %v, %d shards, lease TTL %gs, %d callers -> %d counters, %.1fs measured, a step every %gs (seed %d)\n",
			p.Runners, p.Burst, burstSpread, p.Shards, p.TTL, p.Callers, p.Entities, rep.Measured, p.Every, p.Seed)
	} else {
		fmt.Fprintf(w, "\nchurn: %d runners at start (2..%d), %d shards, lease TTL %gs, %d callers -> %d counters, %.1fs measured, a step every %gs (crash steps %v, seed %d)\n",
			p.Runners, p.Runners+2, p.Shards, p.TTL, p.Callers, p.Entities, rep.Measured, p.Every, onOff(p.Crash), p.Seed)
	}
	fmt.Fprintf(w, "etcd: %s\n", rep.Etcd)
	row := func(name string, cells ...any) {
		fmt.Fprintf(w, "%-32s", name)
		for _, c := range cells {
			fmt.Fprintf(w, " %10v", c)
		}
		fmt.Fprintln(w)
	}
	c := rep.ColdCost
	if rep.ColdDone {
		fmt.Fprintf(w, "cold start: every shard owned %v after the first %d runners started", ms(rep.ColdStart, 1), p.Runners)
	} else {
		fmt.Fprintf(w, "cold start: NOT every shard owned %v after the first %d runners started (given up)", ms(rep.ColdStart, 1), p.Runners)
	}
	if rep.ColdRegistered > 0 {
		fmt.Fprintf(w, "; the last registered after %v", ms(rep.ColdRegistered, 1))
	}
	fmt.Fprintf(w, "; CPU meanwhile: runners %.1f s, etcd %.1f s, gateway %.1f s; etcd delivered %.0f watch events, handled %.0f requests\n",
		c.RunnersCPU, c.EtcdCPU, c.LoadCPU, c.WatchEvents, c.Requests)
	if lc := rep.ColdLoadedCost; lc != nil {
		fmt.Fprintf(w, "cold start: every owned shard's reminders and remembered entities read %v after the first runners started; CPU until then: runners %.1f s, etcd %.1f s; etcd handled %.0f requests\n",
			ms(rep.ColdLoaded, 1), lc.RunnersCPU, lc.EtcdCPU, lc.Requests)
	}
	if len(rep.ColdProgress) > 0 {
		fmt.Fprintln(w)
		row("cold start progress", "registered", "detached", "stopped", "locks", "detaches", "aborted", "CPU s", "etcd CPU s", "watch evs", "etcd reqs", "RSS MB", "heap MB", "goroutines", "fds", "etcd MB")
		for _, s := range rep.ColdProgress {
			row(fmt.Sprintf("+%.1fs", s.At), s.Registered, s.DetachedNow, s.Stopped, s.Locks, s.Detaches, s.Aborted, fmt.Sprintf("%.1f", s.RunnersCPU), fmt.Sprintf("%.1f", s.EtcdCPU),
				fmt.Sprintf("%.0f", s.WatchEvents), fmt.Sprintf("%.0f", s.Requests), fmt.Sprintf("%.0f", s.RSSMB), fmt.Sprintf("%.0f", s.HeapLiveMB), s.Goroutines, s.FDs, fmt.Sprintf("%.0f", s.EtcdRSSMB))
		}
	}
	if st := rep.Steady; st != nil {
		where := "all runners in one process"
		if p.Procs {
			where = "each runner its own process"
		}
		fmt.Fprintf(w, "steady (settled, no load, %gs): %.2f%% of a core per runner (%s), gateway %.2f%%; etcd %.1f puts/s, %.1f deletes/s, %.1f proposals/s, %.1f requests/s, %.1f watch events/s, %.1f%% of a core\n",
			st.Window, st.RunnerCPUPercent, where, st.GatewayCPUPercent, st.PutsPerSec, st.DeletesPerSec, st.ProposalsPerSec, st.RequestsPerSec, st.WatchEventsPerSec, st.EtcdCPUPercent)
		if len(st.RequestsByMethod) > 0 {
			methods := slices.Sorted(maps.Keys(st.RequestsByMethod))
			parts := make([]string, len(methods))
			for i, m := range methods {
				parts[i] = fmt.Sprintf("%s %.1f", m, st.RequestsByMethod[m])
			}
			fmt.Fprintf(w, "  requests/s by method: %s\n", strings.Join(parts, ", "))
		}
	}
	if len(rep.Steps) == 0 {
		rep.printTrouble(w)
		rep.printProblems(w)
		return
	}
	fmt.Fprintln(w)

	var kinds []string
	for _, k := range append(stepKinds, burstKinds...) {
		if p.Burst > 0 == slices.Contains(burstKinds, k) { // -burst: only bursts; else no bursts
			kinds = append(kinds, k)
		}
	}
	row("step kind (medians)", "steps", "settle p50", "settle max", "moved", "watch evs", "/moved", "etcd reqs", "/moved", "etcd txns")
	for _, k := range kinds {
		d, c := rep.Settle[k], rep.StepCost[k]
		row(k, rep.StepCounts[k], ms(d.P50, d.N), ms(d.Max, d.N), c.Moved, fmt.Sprintf("%.0f", c.WatchEvents), fmt.Sprintf("%.1f", c.WatchEventsPerMoved),
			fmt.Sprintf("%.0f", c.Requests), fmt.Sprintf("%.2f", c.RequestsPerMoved), fmt.Sprintf("%.0f", c.Txns))
	}
	fmt.Fprintln(w)
	runners, load := "runners", "callers+gw"
	if p.InProcessLoad {
		runners, load = "runners+load", "-"
	}
	row("step CPU s (medians)", "change", runners, "/runner ms", "etcd", load, "harness")
	for _, k := range kinds {
		c := rep.StepCost[k]
		row(k, fmt.Sprintf("%.2f", c.ChangeCPU), fmt.Sprintf("%.2f", c.RunnersCPU), fmt.Sprintf("%.1f", c.PerRunner), fmt.Sprintf("%.2f", c.EtcdCPU),
			fmt.Sprintf("%.2f", c.LoadCPU), fmt.Sprintf("%.3f", c.HarnessCPU))
	}
	if b := rep.Between; b != nil {
		fmt.Fprintf(w, "between steps (the load alone, %.1fs in all): %s %.0f%% of a core, etcd %.0f%%, %s %.0f%%; etcd %.1f requests/s, %.1f watch events/s\n",
			b.Window, runners, b.RunnersCPUPercent, b.EtcdCPUPercent, load, b.LoadCPUPercent, b.RequestsPerSec, b.WatchEventsPerSec)
	}
	fmt.Fprintln(w)
	row("step (each)", "at", "settle", "moved", "watch evs", "/moved", "etcd reqs", "/moved", "change CPU", runners, "etcd CPU", load)
	for i, s := range rep.Steps {
		c, settle := s.Cost, "-"
		if s.Settled {
			settle = ms(s.Settle, 1)
		}
		row(fmt.Sprintf("%2d %s %s", i+1, s.Kind, s.Runner), fmt.Sprintf("%.1fs", s.At), settle, c.Moved, fmt.Sprintf("%.0f", c.WatchEvents), fmt.Sprintf("%.1f", c.WatchEventsPerMoved),
			fmt.Sprintf("%.0f", c.Requests), fmt.Sprintf("%.2f", c.RequestsPerMoved), fmt.Sprintf("%.2f", c.ChangeCPU), fmt.Sprintf("%.2f", c.RunnersCPU),
			fmt.Sprintf("%.2f", c.EtcdCPU), fmt.Sprintf("%.2f", c.LoadCPU))
	}
	fmt.Fprintln(w)
	row("cutover per moved shard", "shards", "p50", "p99", "max")
	for _, r := range []struct{ name, key string }{
		{"planned (released -> acquired)", "planned"},
		{"  of which released -> lock moved", "planned-transfer"},
		{"  and lock moved -> acquired", "planned-install"},
		{"crash (crash -> acquired)", "crash"},
		{"  then acquired -> first ask", "crash-first-ask"},
		{"    acquired -> gateway's view", "crash-first-ask-routed"},
		{"    and gateway's view -> answer", "crash-first-ask-served"},
	} {
		d := rep.Cutover[r.key]
		row(r.name, d.N, ms(d.P50, d.N), ms(d.P99, d.N), ms(d.Max, d.N))
	}
	fmt.Fprintln(w)
	row("asks (latency of successful)", "ok", "p50", "p99", "max", "failed")
	total := rep.Asks.failed()
	for _, r := range []struct{ name, key string }{
		{"all", "all"}, {"steady", winSteady}, {"during planned moves", winPlanned}, {"during crash windows", winCrash},
	} {
		d := rep.Asks.Latency[r.key]
		failed := total
		if r.key != "all" {
			failed = rep.Asks.FailedIn[r.key]
		}
		row(r.name, d.N, ms(d.P50, d.N), ms(d.P99, d.N), ms(d.Max, d.N), failed)
	}

	var parts []string
	for _, c := range classes {
		parts = append(parts, fmt.Sprintf("%s %d", c, rep.Asks.Failed[c]))
	}
	fmt.Fprintf(w, "\nfailed asks by class: %s\n", strings.Join(parts, ", "))
	for _, c := range classes {
		if s, ok := rep.Asks.Samples[c]; ok {
			fmt.Fprintf(w, "  e.g. %s: %s\n", c, s)
		}
	}
	ph := rep.Phases
	fmt.Fprintf(w, "handoff phase events: warming %d, ready %d, drained %d, cutover %d (reported by both owners), aborted %d\n",
		ph[runner.PhaseWarming], ph[runner.PhaseReady], ph[runner.PhaseDrained], ph[runner.PhaseCutover], ph[runner.PhaseAborted])
	rep.printTrouble(w)
	fmt.Fprintf(w, "shards lost other than by a crash: %d\n", rep.LostNotCrash)
	fmt.Fprintf(w, "double ownership (merged events): %d\n", rep.DoubleOwnership)
	rep.printProblems(w)
}

// printTrouble lists the aborted handoff phases and the detaches by step
// kind and reason.
func (rep *Report) printTrouble(w io.Writer) {
	for _, k := range slices.Sorted(maps.Keys(rep.Aborts)) {
		fmt.Fprintf(w, "  aborted %d: %s\n", rep.Aborts[k], k)
	}
	for _, k := range slices.Sorted(maps.Keys(rep.Detaches)) {
		fmt.Fprintf(w, "detached %d: %s\n", rep.Detaches[k], k)
	}
}

// printProblems ends the printed report: OK, or each problem.
func (rep *Report) printProblems(w io.Writer) {
	if len(rep.Problems) == 0 {
		fmt.Fprintln(w, "OK")
		return
	}
	for _, pr := range rep.Problems {
		fmt.Fprintf(w, "PROBLEM: %s\n", pr)
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// ms formats milliseconds for the table ("-" without samples).
func ms(v float64, n int) string {
	if n == 0 {
		return "-"
	}
	return round(time.Duration(v * float64(time.Millisecond))).String()
}

// round rounds d for display: to 10ms from 1s, to 0.1ms from 10ms, else
// to 10µs.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	default:
		return d.Round(10 * time.Microsecond)
	}
}

// numbers matches the shard numbers, lease IDs and runner numbers of an
// abort's reason.
var numbers = regexp.MustCompile(`[0-9a-f]*[0-9][0-9a-f]*`)

// abortKey classifies an aborted phase event: the side reporting it and
// its reason, numbers elided so that reasons group.
func abortKey(ph runner.HandoffPhase) string {
	side := "new owner"
	if ph.Runner == ph.From {
		side = "old owner"
	}
	return side + ": " + numbers.ReplaceAllString(ph.Detail, "#")
}

// stepKindAt names the step under way at t: the last one begun by then
// ("before the first step" before).
func (h *harness) stepKindAt(t time.Time) string {
	kind := "before the first step"
	for _, s := range h.steps {
		if s.start.After(t) {
			break
		}
		kind = s.Kind
	}
	return kind
}
