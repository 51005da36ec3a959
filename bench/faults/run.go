package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/internal/testenv"
)

// params are one session's knobs (the command's flags).
type params struct {
	Runners         int           // runner processes at the start
	Shards          int           // NumShards
	Entities        int           // counters the driver addresses
	Rate            int           // asks a second (open loop)
	MaxInFlight     int           // asks waiting at once, at most
	TTL             time.Duration // runners' LeaseTTL (the margin is the default TTL/3)
	Work            time.Duration // how long each Inc handler runs
	AskTimeout      time.Duration
	Faults          int      // faults per run
	CheckpointEvery int      // a counter checkpoints every this many increments (and on release)
	Registers       int      // registers the driver addresses (linearizability.go)
	RegisterRate    int      // register operations a second (open loop); 0: none
	Kinds           []string // fault kinds to draw from (nil: all)
	Warmup          time.Duration
	Dir             string // where runs keep their files ("": the temp dir)
	Keep            bool   // keep every run's files (a failed run's are always kept)
	Reminders       int    // counters that register a periodic reminder (every second) before the faults
	Singletons      int    // singletons every runner runs (a shard worker runs too)
	Keepers         int    // remembered entities the driver activates before the faults
}

func defaultParams() params {
	return params{Runners: 4, Shards: 64, Entities: 2000, Rate: 1500, MaxInFlight: 4000, TTL: 5 * time.Second, Work: 5 * time.Millisecond,
		AskTimeout: 12 * time.Second, Faults: 4, CheckpointEvery: 3, Warmup: 2 * time.Second, Reminders: 200,
		Registers: 200, RegisterRate: 150, Singletons: 4, Keepers: 16}
}

// applied is one injected fault with its instants.
type applied struct {
	fault
	Begin, Healed int64 // Mono
}

// result is one run's outcome.
type result struct {
	Seed       uint64
	Schedule   []fault
	Applied    []applied
	Violations []string
	Stats      stats
	Converge   time.Duration // last heal -> converged (-1: never)
	Dir        string        // kept files ("" when removed)
	Tail       string        // a failed run's last events of each runner process
	Err        error         // the run could not be carried out (infrastructure)
	Took       time.Duration
}

// failed reports whether the run found a violation or could not run.
func (r *result) failed() bool { return len(r.Violations) > 0 || r.Err != nil }

// runOnce carries out one seeded run and checks its history.
func runOnce(ctx context.Context, seed uint64, p params, logf func(string, ...any)) *result {
	start := time.Now()
	res := &result{Seed: seed, Schedule: schedule(seed, p.Faults, p), Converge: -1}
	dir, err := os.MkdirTemp(p.Dir, fmt.Sprintf("shardhost-faults-%d-", seed))
	if err != nil {
		res.Err = err
		return res
	}
	res.Dir = dir
	err = runIn(ctx, dir, p, res, logf)
	res.Took = time.Since(start)
	if err != nil {
		res.Err = err
	}
	if !res.failed() {
		removeDir(dir, p.Keep)
		if !p.Keep {
			res.Dir = ""
		}
	}
	return res
}

func runIn(ctx context.Context, dir string, p params, res *result, logf func(string, ...any)) error {
	e, err := newEnv(ctx, p, dir, logf)
	if err != nil {
		return err
	}
	defer e.close()
	driverStalls := probeStalls(ctx)
	defer driverStalls() // on an early return too
	var mu sync.Mutex
	violate := func(format string, args ...any) {
		mu.Lock()
		res.Violations = append(res.Violations, fmt.Sprintf(format, args...))
		mu.Unlock()
	}

	// The first runners, started together.
	var wg sync.WaitGroup
	errs := make([]error, p.Runners)
	for i := range p.Runners {
		wg.Go(func() { errs[i] = e.addRunner(ctx, runnerID(i+1)) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	d, err := startDriver(e)
	if err != nil {
		return err
	}
	defer func() {
		if err := d.stop(); err != nil {
			logf("seed %d: gateway stop: %v", res.Seed, err)
		}
	}()
	if _, why := e.waitConverged(ctx, d, 30*time.Second); why != "" {
		return fmt.Errorf("the cluster did not converge before the faults: %s", why)
	}
	if err := d.armReminders(ctx); err != nil {
		return err
	}
	if err := d.touchKeepers(ctx); err != nil {
		return err
	}
	e.beforeStop = d.touchBeforeStop

	loadCtx, stopLoad := context.WithCancel(ctx)
	loadDone := make(chan struct{})
	go func() { d.load(loadCtx, res.Seed); close(loadDone) }()
	defer func() { stopLoad(); <-loadDone }()
	sleepCtx(ctx, p.Warmup)

	for _, f := range res.Schedule {
		begin, healed, err := e.apply(ctx, f)
		res.Applied = append(res.Applied, applied{fault: f, Begin: begin, Healed: healed})
		if err != nil {
			var live *livenessError
			if ctx.Err() != nil || !errors.As(err, &live) {
				return fmt.Errorf("fault %v: %w", f, err)
			}
			violate("fault %v: %v", f, err)
			break
		}
		logf("seed %d: %v", res.Seed, f)
		sleepCtx(ctx, f.Gap)
	}
	lastHeal := int64(0)
	for _, a := range res.Applied {
		lastHeal = max(lastHeal, a.Healed)
	}
	_, why := e.waitConverged(ctx, d, max(30*time.Second, 6*p.TTL))
	converged := runnerproc.Mono()
	sleepCtx(ctx, reminderPeriod+reminderResume) // the reminders fire again (check 8)
	if why != "" {
		violate("no convergence %v (of time the driver was scheduled) after the last fault: %s", max(30*time.Second, 6*p.TTL), why)
	} else {
		// From the last heal to the convergence, not to now: the wait for
		// the reminders above is not part of it.
		res.Converge = time.Duration(converged - lastHeal) // its bound (2 x TTL) is the checker's
	}
	stopLoad()
	<-loadDone

	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	if failed := d.readAll(rctx); len(failed) > 0 {
		violate("%d entities never answered the final read (e.g. %s)", len(failed), entityID(failed[0]))
	}
	if failed := d.readRegisters(rctx); len(failed) > 0 {
		violate("%d registers never answered the final read (e.g. %s)", len(failed), registerID(failed[0]))
	}
	cancel()
	stopped := runnerproc.Mono()
	if err := e.stopAll(ctx); err != nil {
		violate("graceful stop at the end: %v", err)
	}
	events, err := readBack(ctx, e.cli, deleteKeyPrefix)
	if err != nil {
		return err
	}
	in := &checkInput{
		p: p, asks: d.all(), etcd: events, deleteSeen: e.obs.seen, incarnations: e.incarnations(),
		converged: converged, lastHeal: lastHeal, stopped: stopped, faults: res.Applied, late: d.lateKeepers(),
	}
	if why != "" {
		in.converged = 0 // never converged: check 8's liveness part does not apply
	}
	for _, inc := range in.incarnations {
		recs, err := runnerproc.ReadHistory(inc.history)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("history of %s: %w", inc.id, err)
		}
		in.history = append(in.history, recs...)
	}
	in.stalls = runnerproc.StallsOf(in.history)
	in.stalls[os.Getpid()] = driverStalls()
	vs, st := check(in)
	for _, v := range vs {
		violate("%s", v)
	}
	st.Lin, vs = checkLinearizable(d.registerOps(), dir)
	for _, v := range vs {
		violate("%s", v)
	}
	d.mu.Lock()
	st.AsksShed = d.shed
	d.mu.Unlock()
	st.Faults = map[string]int{}
	for _, a := range res.Applied {
		st.Faults[a.Kind]++
	}
	res.Stats = st
	if len(res.Violations) > 0 {
		writeDump(dir, e)
		res.Tail = lastEvents(in.history, lastEventsShown)
	}
	return nil
}

// probeStalls measures this process's stalls (the driver's: it measures
// convergence) from now until the returned function is first called; it
// returns them (each call).
func probeStalls(ctx context.Context) func() runnerproc.Stalls {
	ctx, cancel := context.WithCancel(ctx)
	var s runnerproc.Stalls
	done := make(chan struct{})
	go func() {
		defer close(done)
		testenv.ProbeStalls(ctx, func(end time.Time, late time.Duration) {
			e := runnerproc.MonoOf(end)
			s = append(s, [2]int64{e - int64(late), e})
		})
	}()
	return func() runnerproc.Stalls {
		cancel()
		<-done
		return s
	}
}

// waitConverged waits until every shard is owned by a live runner, no
// handoff is pending, every live runner is attached with the same
// assignment covering all shards, and one entity of every shard answers.
// It returns how long that took, or why it did not happen within limit of
// the time this process was scheduled (testenv.Patience: a driver the
// machine does not run cannot see the cluster converge; the checker judges
// the convergence time against its bound, stalls counted).
func (e *env) waitConverged(ctx context.Context, d *driver, limit time.Duration) (time.Duration, string) {
	start := time.Now()
	p := testenv.NewPatience(limit)
	why := ""
	for !p.Over() && ctx.Err() == nil {
		if why = e.convergedState(ctx); why == "" {
			if failed := d.probe(ctx, time.Second); len(failed) > 0 {
				why = fmt.Sprintf("%d shards did not answer a probe (e.g. shard %d)", len(failed), failed[0])
			} else {
				return time.Since(start), ""
			}
		}
		p.Sleep(100 * time.Millisecond)
	}
	if why == "" {
		why = "cancelled"
	}
	return time.Since(start), why
}

func (e *env) convergedState(ctx context.Context) string {
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	get := func(ks string) (*clientv3.GetResponse, error) {
		return e.cli.Get(cctx, deleteKeyPrefix+ks+"/", clientv3.WithPrefix())
	}
	rs, err := get("runners")
	if err != nil {
		return "list runners: " + err.Error()
	}
	leaseOf := map[string]int64{}
	for _, kv := range rs.Kvs {
		leaseOf[strings.TrimPrefix(string(kv.Key), deleteKeyPrefix+"runners/")] = kv.Lease
	}
	live := e.live()
	leases := map[int64]bool{}
	var digest string
	owned := 0
	for _, p := range live {
		l, ok := leaseOf[p.ID()]
		if !ok || l == 0 {
			return fmt.Sprintf("runner %s has no record", p.ID())
		}
		leases[l] = true
		var dg string
		detached := false
		shards := map[int]bool{}
		for _, ev := range p.Events() {
			switch ev.Kind {
			case runnerproc.KindAssignment:
				dg = ev.Detail
			case runnerproc.KindAcquired:
				shards[ev.Shard] = true
			case runnerproc.KindReleased, runnerproc.KindLost:
				delete(shards, ev.Shard)
			case runnerproc.KindDetached:
				detached = true
			case runnerproc.KindReattached, runnerproc.KindRegistered:
				detached = false
			}
		}
		cnt := len(shards)
		if detached {
			return fmt.Sprintf("runner %s is detached", p.ID())
		}
		if digest == "" {
			digest = dg
		} else if dg != digest {
			return fmt.Sprintf("runners disagree on the assignment (%s: %s, others %s)", p.ID(), dg, digest)
		}
		owned += cnt
	}
	if owned != e.p.Shards {
		return fmt.Sprintf("runners own %d of %d shards", owned, e.p.Shards)
	}
	ss, err := get("shards")
	if err != nil {
		return "list locks: " + err.Error()
	}
	held := map[int]bool{}
	for _, kv := range ss.Kvs {
		n, err := strconv.Atoi(strings.TrimPrefix(string(kv.Key), deleteKeyPrefix+"shards/"))
		if err == nil && leases[kv.Lease] {
			held[n] = true
		}
	}
	if len(held) != e.p.Shards {
		return fmt.Sprintf("%d of %d shards locked by a live runner", len(held), e.p.Shards)
	}
	hs, err := get("handoffs")
	if err != nil {
		return "list handoffs: " + err.Error()
	}
	if len(hs.Kvs) > 0 {
		return fmt.Sprintf("%d handoffs pending", len(hs.Kvs))
	}
	return ""
}

// lastEventsShown is how many of each runner process's last events a
// failed run prints.
const lastEventsShown = 12

// lastEvents lists the last n events of each runner process of a history:
// its registrations, detaches, ownership changes and always-on runs (not
// its handlers, entity activations and releases, checkpoints, reminder
// fires or stalls, which the violations name). Records of one kind and
// detail within 10 ms of each other make one line, with their shards.
func lastEvents(history []runnerproc.Record, n int) string {
	type group struct {
		first  runnerproc.Record
		shards []int
	}
	byPID := map[int][]*group{}
	recs := slices.Clone(history)
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Mono < recs[j].Mono })
	for _, r := range recs {
		switch r.Kind {
		case runnerproc.HistStart, runnerproc.HistEnd, runnerproc.HistCheckpoint, runnerproc.HistFire, runnerproc.HistStall,
			runnerproc.HistActivate, runnerproc.HistRelease:
			continue
		}
		gs := byPID[r.PID]
		if k := len(gs) - 1; k >= 0 && gs[k].first.Kind == r.Kind && gs[k].first.Detail == r.Detail && r.Mono-gs[k].first.Mono <= int64(10*time.Millisecond) {
			gs[k].shards = append(gs[k].shards, r.Shard)
			continue
		}
		byPID[r.PID] = append(gs, &group{first: r, shards: []int{r.Shard}})
	}
	var b strings.Builder
	for _, pid := range slices.Sorted(maps.Keys(byPID)) {
		gs := byPID[pid]
		fmt.Fprintf(&b, "  last %d of %d events of %s (pid %d), same kind within 10 ms on one line:\n", min(n, len(gs)), len(gs), gs[0].first.Runner, pid)
		for _, g := range gs[max(0, len(gs)-n):] {
			r := g.first
			fmt.Fprintf(&b, "    %s %s", at(r.Mono), r.Kind)
			if len(g.shards) == 1 {
				fmt.Fprintf(&b, " shard %d epoch %d", r.Shard, r.Epoch)
			} else {
				shards := slices.Compact(slices.Sorted(slices.Values(g.shards)))
				fmt.Fprintf(&b, " %d records, shards %v", len(g.shards), shards)
			}
			if r.Lease != 0 {
				fmt.Fprintf(&b, " lease %x", r.Lease)
			}
			if r.Detail != "" {
				fmt.Fprintf(&b, " (%s)", r.Detail)
			}
			if r.Err != "" {
				fmt.Fprintf(&b, " err %s", r.Err)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// writeDump keeps the runners' log tails next to a failed run's histories.
func writeDump(dir string, e *env) {
	var b strings.Builder
	for pid, in := range e.incarnations() {
		fmt.Fprintf(&b, "=== %s pid %d\n%s\n", in.id, pid, in.proc.Stderr())
	}
	_ = os.WriteFile(filepath.Join(dir, "runner-logs.txt"), []byte(b.String()), 0o644)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
