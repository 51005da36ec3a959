package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// settleLimit bounds every wait for a cluster to settle.
const settleLimit = 3 * time.Minute

// leaseTTL is the runners' LeaseTTL.
func (p params) leaseTTL() time.Duration {
	if p.ttl > 0 {
		return p.ttl
	}
	return runner.DefaultLeaseTTL
}

// benchHandover: singleton handovers on planned moves (joins and graceful
// shutdowns).
func benchHandover(ctx context.Context, p params, w io.Writer) error {
	e, err := newEnv(ctx, p)
	if err != nil {
		return err
	}
	defer e.close()
	e.transport = p.busy > 0 // asks reach the entities of other runners
	ids := twinIDs(p.handRemembered, p.shards, -1)
	if err := e.remember(ctx, ids); err != nil {
		return err
	}
	for i := range p.runners {
		if _, err := e.start(fmt.Sprint("r", i+1)); err != nil {
			return err
		}
	}
	cold, err := e.waitSettled(ctx, ids, settleLimit)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "   %d runners, %d shards, %d singletons, %d remembered entities: settled %v after the start\n", p.runners, p.shards, p.singletons, len(ids), cold.Round(time.Millisecond))
	load := startBusy(e, p)
	since := time.Now()
	next := p.runners + 1
	var settles []time.Duration
	for round := range p.rounds {
		id := fmt.Sprint("r", next)
		next++
		t0 := time.Now()
		if _, err := e.start(id); err != nil {
			return err
		}
		load.publish(e)
		if _, err := e.waitSettled(ctx, ids, settleLimit); err != nil {
			return fmt.Errorf("round %d, join %s: %w", round+1, id, err)
		}
		settles = append(settles, time.Since(t0))
		old := e.live()[0]
		t0 = time.Now()
		load.publish(e, old)
		if err := old.shutdown(); err != nil {
			return fmt.Errorf("round %d, shutdown %s: %w", round+1, old.r.ID(), err)
		}
		if _, err := e.waitSettled(ctx, ids, settleLimit); err != nil {
			return fmt.Errorf("round %d, after the shutdown of %s: %w", round+1, old.r.ID(), err)
		}
		settles = append(settles, time.Since(t0))
	}
	if err := load.stop(w); err != nil {
		return err
	}
	runs, _ := e.life.snapshot()
	evs := e.evs.snapshot()
	hs := handovers(runs, since)
	work := e.life.handlers()
	var gaps, drain, transfer, watch, start, batches, toHandler, handlerToRel []time.Duration
	overlaps, sameRunner, waited, ownShard := 0, 0, 0, 0
	var worst handover
	for _, h := range hs {
		if h.overlap {
			overlaps++
			fmt.Fprintf(w, "   OVERLAP: %s on %s [%v, %v] and on %s from %v\n", h.name, h.from.runner, h.from.start.Format(time.StampMicro),
				h.from.end.Format(time.StampMicro), h.to.runner, h.to.start.Format(time.StampMicro))
			continue
		}
		if h.from.runner == h.to.runner {
			sameRunner++
		}
		gaps = append(gaps, h.gap)
		if h.gap >= worst.gap {
			worst = h
		}
		shard := int(runner.SingletonShard(h.name, p.shards))
		rel := releasedAt(evs, h.from.runner, shard, h.from.epoch)
		cut := phaseAt(evs, h.from.runner, shard, runner.PhaseCutover, rel)
		acq := acquiredAt(evs, h.to.runner, shard, h.to.epoch)
		if rel.IsZero() || cut.IsZero() || acq.IsZero() {
			continue
		}
		drain = append(drain, rel.Sub(h.from.end))
		// The shards cut over with this one (released together), and the
		// last of their handlers still running when the singleton returned.
		batch := map[int]bool{}
		for _, ev := range evs {
			if r, ok := ev.(runner.ShardReleased); ok && r.Runner == h.from.runner && r.Time.Sub(rel).Abs() < 2*time.Millisecond {
				batch[int(r.Shard)] = true
			}
		}
		batches = append(batches, time.Duration(len(batch)))
		var lastEnd time.Time
		for _, hr := range work {
			if hr.runner == h.from.runner && batch[hr.shard] && hr.start.Before(h.from.end) && hr.end.After(h.from.end) {
				if hr.shard == shard {
					ownShard++
				} else if hr.end.After(lastEnd) {
					lastEnd = hr.end
				}
			}
		}
		if !lastEnd.IsZero() {
			waited++
			toHandler = append(toHandler, lastEnd.Sub(h.from.end))
			handlerToRel = append(handlerToRel, rel.Sub(lastEnd))
		}
		transfer = append(transfer, cut.Sub(rel))
		watch = append(watch, acq.Sub(cut))
		start = append(start, h.to.start.Sub(acq))
	}
	p50, p99, mx := quantiles(gaps)
	fmt.Fprintf(w, "   %d rounds (a join, then a graceful shutdown): %d singleton handovers (%d on the same runner), gap (new start - old return) p50 %s, p99 %s, max %s (target <= 500 ms); overlaps %d (all runs: %d)\n",
		p.rounds, len(gaps), sameRunner, ms(p50), ms(p99), ms(mx), overlaps, overlapsAll(runs))
	part := func(name string, ds []time.Duration) {
		p50, p99, mx := quantiles(ds)
		fmt.Fprintf(w, "     %-58s p50 %s, p99 %s, max %s\n", name, ms(p50), ms(p99), ms(mx))
	}
	b50, _, bmx := quantiles(batches)
	fmt.Fprintf(w, "   parts of %d handovers (each cut over with p50 %d, max %d shards of its old owner):\n", len(drain), b50, bmx)
	part("old return -> ShardReleased (rest of the drain, progress):", drain)
	part("ShardReleased -> cutover (the lock transfer txn):", transfer)
	part("cutover -> ShardAcquired on the new owner (watch, install):", watch)
	part("ShardAcquired -> new start (the worker goroutine):  ", start)
	if waited > 0 || ownShard > 0 {
		fmt.Fprintf(w, "   in %d of %d handovers a handler of another shard of the same cutover was running when the singleton returned (of its own shard: %d):\n", waited, len(drain), ownShard)
		part("old return -> the last such handler's end:", toHandler)
		part("that end -> ShardReleased:", handlerToRel)
	}
	if worst.name != "" {
		shard := int(runner.SingletonShard(worst.name, p.shards))
		rel := releasedAt(evs, worst.from.runner, shard, worst.from.epoch)
		cut := phaseAt(evs, worst.from.runner, shard, runner.PhaseCutover, rel)
		acq := acquiredAt(evs, worst.to.runner, shard, worst.to.epoch)
		fmt.Fprintf(w, "   worst: %s shard %d %s -> %s: returned, +%s released, +%s cutover, +%s acquired, +%s started\n", worst.name, shard,
			worst.from.runner, worst.to.runner, ms(sinceOr(rel, worst.from.end)), ms(sinceOr(cut, worst.from.end)), ms(sinceOr(acq, worst.from.end)), ms(worst.gap))
	}
	_, acts := e.life.snapshot()
	egaps, eover, reasons := entityMoves(acts, e.life.releases(), since)
	p50, p99, mx = quantiles(egaps)
	fmt.Fprintf(w, "   remembered entities: %d moves (activations by reason: %v), gap (new Activate - old Release) p50 %s, p99 %s, max %s; activated before the old instance's release %d\n",
		len(egaps), reasons, ms(p50), ms(p99), ms(mx), len(eover))
	for i, o := range eover {
		if i == 5 {
			fmt.Fprintf(w, "     ...\n")
			break
		}
		fmt.Fprintf(w, "     OVERLAP: %s\n", o)
	}
	p50, _, mx = quantiles(settles)
	fmt.Fprintf(w, "   each move settled (every shard owned by its assignee, every singleton and remembered entity running there) in p50 %s, max %s\n", ms(p50), ms(mx))
	if n := overlapsAll(runs); n > 0 {
		return fmt.Errorf("%d pairs of instances of one singleton ran at once", n)
	}
	if len(eover) > 0 {
		return fmt.Errorf("%d remembered entities activated on a runner while their instance elsewhere had not been released", len(eover))
	}
	return nil
}

// busyLoad is the handover scenario's -busy callers.
type busyLoad struct {
	p       params
	routers atomic.Pointer[[]*runner.Runner]
	done    chan struct{}
	wg      sync.WaitGroup
	ok, bad atomic.Int64
	lastErr atomic.Value
}

// startBusy starts p.busy callers (none if 0).
func startBusy(e *env, p params) *busyLoad {
	b := &busyLoad{p: p, done: make(chan struct{})}
	b.publish(e)
	for c := range p.busy {
		b.wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-b.done:
					return
				default:
				}
				rs := *b.routers.Load()
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				_, err := work.Ask(ctx, rs[(c+i)%len(rs)], fmt.Sprint("b", (c*7919+i*104729)%5000), p.busyHandler)
				cancel()
				if err != nil {
					b.bad.Add(1)
					b.lastErr.Store(err.Error())
					continue
				}
				b.ok.Add(1)
			}
		})
	}
	return b
}

// publish sets the runners the callers send through: the live ones but
// leaving.
func (b *busyLoad) publish(e *env, leaving ...*node) {
	var rs []*runner.Runner
	for _, n := range e.live() {
		if !slices.Contains(leaving, n) {
			rs = append(rs, n.r)
		}
	}
	b.routers.Store(&rs)
}

// stop stops the callers and reports their asks.
func (b *busyLoad) stop(w io.Writer) error {
	close(b.done)
	b.wg.Wait()
	if b.p.busy == 0 {
		return nil
	}
	last, _ := b.lastErr.Load().(string)
	fmt.Fprintf(w, "   load: %d callers, handlers of %v: %d asks served, %d failed (last error: %q)\n", b.p.busy, b.p.busyHandler, b.ok.Load(), b.bad.Load(), last)
	return nil
}

// sinceOr returns t - from, or unmeasured when t is zero.
func sinceOr(t, from time.Time) time.Duration {
	if t.IsZero() {
		return unmeasured
	}
	return t.Sub(from)
}

// phaseAt returns when runner reported handoff phase of shard, at or after
// after (zero if not seen).
func phaseAt(evs []runner.Event, runnerID string, shard int, phase string, after time.Time) time.Time {
	for _, ev := range evs {
		if h, ok := ev.(runner.HandoffPhase); ok && h.Runner == runnerID && int(h.Shard) == shard && h.Phase == phase && !h.Time.Before(after) {
			return h.Time
		}
	}
	return time.Time{}
}

// benchCrash: singletons and remembered entities after an abrupt stop.
func benchCrash(ctx context.Context, p params, w io.Writer) error {
	for _, mode := range p.crash {
		if err := crashMode(ctx, p, mode, w); err != nil {
			return fmt.Errorf("%s: %w", mode, err)
		}
	}
	return nil
}

func crashMode(ctx context.Context, p params, mode string, w io.Writer) error {
	e, err := newEnv(ctx, p)
	if err != nil {
		return err
	}
	defer e.close()
	e.transport = mode == "kill"
	ids := twinIDs(p.crashRemembered, p.shards, -1)
	if err := e.remember(ctx, ids); err != nil {
		return err
	}
	rev, err := e.revision(ctx)
	if err != nil {
		return err
	}
	runnersW := e.watch("runners/", rev)
	for i := range p.runners - 1 {
		if _, err := e.start(fmt.Sprint("r", i+1)); err != nil {
			return err
		}
	}
	victims := map[string]func() time.Time{}
	startVictim := func(id string) error {
		if mode == "kill" {
			k, err := e.startChild(id)
			if err != nil {
				return err
			}
			victims[id] = k.kill
			return nil
		}
		n, err := e.start(id)
		if err != nil {
			return err
		}
		victims[id] = func() time.Time { t := time.Now(); n.close(); return t }
		return nil
	}
	if err := startVictim("v1"); err != nil {
		return err
	}
	if _, err := e.waitSettled(ctx, ids, settleLimit); err != nil {
		return err
	}
	how := map[string]string{"close": "Runner.Close in this process (no release, the lease runs out)", "kill": "SIGKILL of a runner process"}[mode]
	fmt.Fprintf(w, "   %s; %d runners, %d shards, %d singletons, %d remembered entities; LeaseTTL %v\n", how, p.runners, p.shards, p.singletons, len(ids), p.leaseTTL())
	var singles, entities, expiries, singlesAfter, entitiesAfter []time.Duration
	for rep := range p.repeat {
		victim := fmt.Sprint("v", rep+1)
		locks := e.locks()
		owner := func(shard sharding.ShardID) string { return locks[shard].Owner.RunnerID }
		var mine []string
		for i := range p.singletons {
			if owner(runner.SingletonShard(singleName(i), p.shards)) == victim {
				mine = append(mine, singleName(i))
			}
		}
		var myIDs []string
		for _, id := range ids {
			if owner(sharding.ShardOf(id, p.shards)) == victim {
				myIDs = append(myIDs, id)
			}
		}
		victimShards := map[sharding.ShardID]bool{}
		for id := range p.shards {
			if owner(sharding.ShardID(id)) == victim {
				victimShards[sharding.ShardID(id)] = true
			}
		}
		at := victims[victim]()
		if mode == "kill" {
			e.life.endRunsOf(victim, at) // its instances died with it
		}
		if _, err := e.waitSettled(ctx, ids, settleLimit); err != nil {
			return fmt.Errorf("after stopping %s: %w", victim, err)
		}
		runs, acts := e.life.snapshot()
		evs := e.evs.snapshot()
		single := unmeasured
		for _, name := range mine {
			for _, r := range runs {
				if r.name == name && r.runner != victim && r.start.After(at) {
					single = max(single, r.start.Sub(at))
					break
				}
			}
		}
		entity := unmeasured
		pending := map[string]bool{}
		for _, id := range myIDs {
			pending[id] = true
		}
		for _, a := range acts {
			if pending[a.ID] && a.Runner != victim && a.At.After(at) {
				delete(pending, a.ID)
				entity = max(entity, a.At.Sub(at))
			}
		}
		var firstAcq time.Time
		for _, ev := range evs {
			if a, ok := ev.(runner.ShardAcquired); ok && victimShards[a.Shard] && a.Time.After(at) && (firstAcq.IsZero() || a.Time.Before(firstAcq)) {
				firstAcq = a.Time
			}
		}
		gone := runnersW.deletedAt("/"+e.ns+"/"+storage.Key(storage.KeyspaceRunners, victim), at)
		expiry := sinceOr(gone, at)
		expiries = append(expiries, expiry)
		if len(mine) > 0 {
			singles = append(singles, single)
			if expiry != unmeasured {
				singlesAfter = append(singlesAfter, single-expiry)
			}
		}
		if len(myIDs) > 0 {
			entities = append(entities, entity)
			if expiry != unmeasured {
				entitiesAfter = append(entitiesAfter, entity-expiry)
			}
		}
		fmt.Fprintf(w, "   stop %d (%s: %d shards, %d singletons, %d remembered entities): its lease's keys deleted +%s, first shard re-owned +%s, its singletons running again +%s, all its remembered entities +%s\n",
			rep+1, victim, len(victimShards), len(mine), len(myIDs), ms(expiry), ms(sinceOr(firstAcq, at)), ms(single), ms(entity))
		if len(pending) > 0 {
			return fmt.Errorf("%d remembered entities of %s not activated again", len(pending), victim)
		}
		if rep+1 < p.repeat {
			if err := startVictim(fmt.Sprint("v", rep+2)); err != nil {
				return err
			}
			if _, err := e.waitSettled(ctx, ids, settleLimit); err != nil {
				return err
			}
		}
	}
	runs, _ := e.life.snapshot()
	bound := p.leaseTTL() + time.Second
	s50, _, smx := quantiles(singles)
	e50, _, emx := quantiles(entities)
	x50, _, xmx := quantiles(expiries)
	fmt.Fprintf(w, "   %d stops: singletons running again p50 %s, max %s; remembered entities all running again p50 %s, max %s (target LeaseTTL + 1 s = %v); lease keys deleted p50 %s, max %s; singleton overlaps %d\n",
		p.repeat, ms(s50), ms(smx), ms(e50), ms(emx), bound, ms(x50), ms(xmx), overlapsAll(runs))
	s50, _, smx = quantiles(singlesAfter)
	e50, _, emx = quantiles(entitiesAfter)
	fmt.Fprintf(w, "   after the lease's keys were deleted: singletons running again p50 %s, max %s; remembered entities p50 %s, max %s\n", ms(s50), ms(smx), ms(e50), ms(emx))
	if n := overlapsAll(runs); n > 0 {
		return fmt.Errorf("%d pairs of instances of one singleton ran at once", n)
	}
	return nil
}

// benchRestart: a cold start with many remembered entities in one shard.
func benchRestart(ctx context.Context, p params, w io.Writer) error {
	for _, rate := range p.rates {
		if err := restartOnce(ctx, p, rate, w); err != nil {
			return err
		}
	}
	return nil
}

func restartOnce(ctx context.Context, p params, rate int, w io.Writer) error {
	p.startRate, p.singletons = rate, 0
	e, err := newEnv(ctx, p)
	if err != nil {
		return err
	}
	defer e.close()
	shard := sharding.ShardID(p.restartShard % p.shards)
	ids := twinIDs(p.restart, p.shards, int(shard))
	t0 := time.Now()
	if err := e.remember(ctx, ids); err != nil {
		return err
	}
	stored := time.Since(t0)
	start := time.Now()
	if _, err := e.start("r1"); err != nil {
		return err
	}
	for e.life.activations() < len(ids) {
		if time.Since(start) > settleLimit {
			return fmt.Errorf("%d of %d activated after %v", e.life.activations(), len(ids), settleLimit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
	_, acts := e.life.snapshot()
	var acq, allOwned time.Time
	owned := map[sharding.ShardID]bool{}
	for _, ev := range e.evs.snapshot() {
		a, ok := ev.(runner.ShardAcquired)
		if !ok || owned[a.Shard] {
			continue
		}
		owned[a.Shard] = true
		if a.Shard == shard {
			acq = a.Time
		}
		if len(owned) == p.shards {
			allOwned = a.Time
		}
	}
	if acq.IsZero() {
		return fmt.Errorf("no ShardAcquired for shard %d", shard)
	}
	seen := map[string]bool{}
	var first, last time.Time
	for _, a := range acts {
		if a.Reason != "remembered" {
			return fmt.Errorf("%s activated for %q, want remembered", a.ID, a.Reason)
		}
		seen[a.ID] = true
		if first.IsZero() || a.At.Before(first) {
			first = a.At
		}
		last = a.At
	}
	if len(seen) != len(ids) {
		return fmt.Errorf("%d distinct entities activated, want %d", len(seen), len(ids))
	}
	name := fmt.Sprintf("%d/s", rate)
	if rate == 0 {
		name = fmt.Sprintf("%d/s (default)", runner.DefaultRememberedStartRate)
	}
	fmt.Fprintf(w, "   %d remembered entities in shard %d (stored in %v), cold start of one runner (%d shards), RememberedStartRate %s: shard acquired +%s after the start; from the acquisition: first activation +%s, all %d activated +%s (target <= 1 s at the default); %.0f activations/s between the first and the last; every shard acquired +%s after the start\n",
		len(ids), shard, stored.Round(time.Millisecond), p.shards, name, ms(acq.Sub(start)), ms(first.Sub(acq)), len(ids), ms(last.Sub(acq)),
		float64(len(ids)-1)/last.Sub(first).Seconds(), ms(sinceOr(allOwned, start)))
	return nil
}

// benchWrites: etcd writes caused by remembered entities.
func benchWrites(ctx context.Context, p params, w io.Writer) error {
	with, err := writesOnce(ctx, p, p.entities, w)
	if err != nil {
		return err
	}
	without, err := writesOnce(ctx, p, 0, w)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "   the same moves without remembered entities: %d writes; with %d: %d (%+d)\n", without, p.entities, with, with-without)
	return nil
}

// writesOnce runs the writes scenario with k remembered entities and
// returns the writes of the planned moves.
func writesOnce(ctx context.Context, p params, k int, w io.Writer) (int64, error) {
	p.singletons = 0 // their records would count in the moves
	e, err := newEnv(ctx, p)
	if err != nil {
		return 0, err
	}
	defer e.close()
	for i := range p.runners {
		if _, err := e.start(fmt.Sprint("r", i+1)); err != nil {
			return 0, err
		}
	}
	if _, err := e.waitSettled(ctx, nil, settleLimit); err != nil {
		return 0, err
	}
	quiet := func() (int64, error) { // the revision once it stopped moving for p.quiet
		last, err := e.revision(ctx)
		for err == nil {
			time.Sleep(p.quiet)
			var r int64
			if r, err = e.revision(ctx); err == nil && r == last {
				return r, nil
			}
			last = r
		}
		return 0, err
	}
	rev0, err := quiet()
	if err != nil {
		return 0, err
	}
	marks := e.watch("remembered/", rev0)
	ids := twinIDs(k, p.shards, -1)
	if k > 0 {
		t0 := time.Now()
		if err := askAll(ctx, e, ids, len(ids)); err != nil {
			return 0, err
		}
		took := time.Since(t0)
		for {
			n, err := e.count(ctx, "remembered/")
			if err != nil {
				return 0, err
			}
			if n == int64(k) {
				break
			}
			if time.Since(t0) > settleLimit {
				return 0, fmt.Errorf("%d of %d markers written", n, k)
			}
			time.Sleep(10 * time.Millisecond)
		}
		markersIn := time.Since(t0)
		rev1, err := quiet()
		if err != nil {
			return 0, err
		}
		ev, wr := marks.between(rev0, rev1)
		fmt.Fprintf(w, "   %d runners, %d shards: %d remembered entities activated (one message each, %v), every marker stored %v after the first message: %d etcd writes (revisions), %d of them writing %d markers (%.1f markers a write)\n",
			p.runners, p.shards, k, took.Round(time.Millisecond), markersIn.Round(time.Millisecond), rev1-rev0, wr, ev, float64(ev)/float64(max(wr, 1)))
		if p.messages > 0 {
			t0 = time.Now()
			if err := askAll(ctx, e, ids, p.messages); err != nil {
				return 0, err
			}
			took = time.Since(t0)
			rev2, err := quiet()
			if err != nil {
				return 0, err
			}
			ev, wr = marks.between(rev1, rev2)
			fmt.Fprintf(w, "   %d messages to them in %v (%.0f/s): %d etcd writes (%d touching markers)\n", p.messages, took.Round(time.Millisecond), float64(p.messages)/took.Seconds(), rev2-rev1, wr)
		}
	}
	rev2, err := quiet()
	if err != nil {
		return 0, err
	}
	all := e.watch("", rev2)
	olds := e.live()
	var acquired atomic.Int64
	countFrom := len(e.evs.snapshot())
	t0 := time.Now()
	for i := range p.runners {
		if _, err := e.start(fmt.Sprint("n", i+1)); err != nil {
			return 0, err
		}
		if _, err := e.waitSettled(ctx, ids, settleLimit); err != nil {
			return 0, err
		}
	}
	for _, n := range olds {
		if err := n.shutdown(); err != nil {
			return 0, err
		}
		if _, err := e.waitSettled(ctx, ids, settleLimit); err != nil {
			return 0, err
		}
	}
	took := time.Since(t0)
	rev3, err := quiet()
	if err != nil {
		return 0, err
	}
	for _, ev := range e.evs.snapshot()[countFrom:] {
		if _, ok := ev.(runner.ShardAcquired); ok {
			acquired.Add(1)
		}
	}
	var counted int64
	for _, n := range e.live() {
		counted += n.r.Status().Remembered
	}
	if counted != int64(k) {
		return 0, fmt.Errorf("after the moves the runners count %d remembered entities (RememberedCount), want %d", counted, k)
	}
	ev, wr := marks.between(rev2, rev3)
	resp, err := e.cli.Get(ctx, "/"+e.ns+"/remembered/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, err
	}
	var newest int64
	for _, kv := range resp.Kvs {
		newest = max(newest, kv.ModRevision)
	}
	fmt.Fprintf(w, "   %d remembered entities; planned moves of every shard (%d runners join, the %d old ones shut down, %v, %d shard acquisitions): %d etcd writes (%.2f a shard acquisition; by keyspace touched: %v), %d of them touching markers (%d events); %d markers stored, newest written at revision %d (the moves began after %d)\n",
		k, p.runners, p.runners, took.Round(time.Millisecond), acquired.Load(), rev3-rev2, float64(rev3-rev2)/float64(max(acquired.Load(), 1)), all.byKeyspace(e.ns, rev2, rev3), wr, ev, len(resp.Kvs), newest, rev2)
	return rev3 - rev2, nil
}

// askAll sends n asks (ping) to ids in turn, 64 at a time, each through
// the runner owning the entity's shard (the runners of this process serve
// no transport).
func askAll(ctx context.Context, e *env, ids []string, n int) error {
	byID := map[string]*runner.Runner{}
	for _, nd := range e.live() {
		byID[nd.r.ID()] = nd.r
	}
	owners := make([]*runner.Runner, len(ids))
	locks := e.locks()
	for i, id := range ids {
		o := locks[sharding.ShardOf(id, e.p.shards)].Owner.RunnerID
		if owners[i] = byID[o]; owners[i] == nil {
			return fmt.Errorf("%s: owner %q not a live runner of this process", id, o)
		}
	}
	var next atomic.Int64
	var mu sync.Mutex
	var first error
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err := ping.Ask(cctx, owners[i%len(ids)], ids[i%len(ids)], none{})
				cancel()
				if err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("ask %s: %w", ids[i%len(ids)], err)
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}
