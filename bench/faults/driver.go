package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/etcd"
)

// ask is one call the driver made and what came of it.
type ask struct {
	Entity int
	Get    bool  // a read (Get), else an increment (Inc)
	Sent   int64 // Mono
	Done   int64 // Mono
	OK     bool
	Resp   runnerproc.CountResp // when OK
	Class  string               // when not OK: the error's class
	Err    string
}

// Error classes of failed asks.
const (
	classMaybe    = "maybe-delivered" // ErrMaybeDelivered (the handler may have run)
	classStale    = "stale-result"    // *StaleResultError (a result withheld: ran under a lost shard)
	classDeadline = "deadline"        // the ask's context ended first
	classNoOwner  = "no-owner"        // ErrNoOwner
	classNotOwner = "not-owner"       // *NotOwnerError
	classOther    = "other"
)

func classify(err error) string {
	var stale *runner.StaleResultError
	var notOwner *runner.NotOwnerError
	switch {
	case errors.As(err, &stale):
		return classStale
	case errors.Is(err, runner.ErrMaybeDelivered):
		return classMaybe
	case errors.Is(err, context.DeadlineExceeded):
		return classDeadline
	case errors.Is(err, runner.ErrNoOwner):
		return classNoOwner
	case errors.As(err, &notOwner):
		return classNotOwner
	default:
		return classOther
	}
}

// driver is the client-only gateway in this process and its callers.
type driver struct {
	p   params
	gw  *runner.Runner
	run chan error

	mu   sync.Mutex
	asks []ask
	shed int // asks due while MaxInFlight were waiting: not sent

	reg registers // the register load (linearizability.go)

	late      []lateKeeper // keepers touched right before a graceful stop
	lateTried int
}

// lateKeeper is a keeper touched right before its runner's graceful stop,
// and the touch's answer.
type lateKeeper struct {
	id   string
	resp runnerproc.TouchResp
	at   int64 // Mono of the answer
}

func entityID(i int) string { return fmt.Sprintf("c%d", i) }

func startDriver(e *env) (*driver, error) {
	store, err := etcd.New(e.cli, namespace, etcd.Config{})
	if err != nil {
		return nil, err
	}
	gw, err := runner.New(store, runner.Config{
		ID: "gateway", ClientOnly: true, NumShards: e.p.Shards, LeaseTTL: e.p.TTL,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return nil, err
	}
	if err := gw.Register(runnerproc.Kind, runnerproc.Counter, runnerproc.Register, runnerproc.Keeper); err != nil {
		return nil, err
	}
	d := &driver{p: e.p, gw: gw, run: make(chan error, 1)}
	go func() { d.run <- gw.Run(context.Background()) }()
	return d, nil
}

func (d *driver) record(a ask) {
	d.mu.Lock()
	d.asks = append(d.asks, a)
	d.mu.Unlock()
}

// call sends one Inc or Get to entity i and records it.
func (d *driver) call(ctx context.Context, i int, get bool, timeout time.Duration) ask {
	a := ask{Entity: i, Get: get, Sent: runnerproc.Mono()}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	var err error
	if get {
		a.Resp, err = runnerproc.Get.Ask(cctx, d.gw, entityID(i), runnerproc.GetReq{})
	} else {
		a.Resp, err = runnerproc.Inc.Ask(cctx, d.gw, entityID(i), runnerproc.IncReq{Work: d.p.Work})
	}
	cancel()
	a.Done = runnerproc.Mono()
	if err != nil {
		a.Class, a.Err = classify(err), err.Error()
	} else {
		a.OK = true
	}
	d.record(a)
	return a
}

// load sends Rate asks a second until ctx ends, open loop: each ask runs
// on its own goroutine, so asks stuck on a frozen or cut-off runner do not
// slow the others down (a closed loop of callers would all end up waiting
// on the frozen runner, and nothing would reach the shards' new owners).
// At most MaxInFlight asks wait at once; an ask due beyond that is not
// sent (counted as shed).
func (d *driver) load(ctx context.Context, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 1))
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { d.loadRegisters(ctx, seed) })
	d.openLoop(ctx, d.p.Rate, func() func() {
		i, get := rng.IntN(d.p.Entities), rng.IntN(10) == 0
		// Not ctx: stopping the load lets the asks in flight finish.
		return func() { d.call(context.Background(), i, get, d.p.AskTimeout) }
	})
}

// openLoop makes rate calls a second until ctx ends, in bursts every 2 ms:
// an open loop, slow calls do not slow it. next, called on the loop's
// goroutine (its random draws in a fixed order), returns each call, which
// runs on a goroutine of its own; at most MaxInFlight of them wait at
// once, and a call due beyond that is not made (counted as shed). It
// returns when the calls made have returned.
func (d *driver) openLoop(ctx context.Context, rate int, next func() func()) {
	sem := make(chan struct{}, d.p.MaxInFlight)
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	start, sent := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		due := int(time.Since(start).Seconds()*float64(rate)) - sent
		for range due {
			sent++
			call := next()
			select {
			case sem <- struct{}{}:
			default:
				d.mu.Lock()
				d.shed++
				d.mu.Unlock()
				continue
			}
			wg.Go(func() {
				defer func() { <-sem }()
				call()
			})
		}
	}
}

// probe asks one entity of every shard (Get) once; it returns the shards
// whose probe failed.
func (d *driver) probe(ctx context.Context, timeout time.Duration) []int {
	ents := probeEntities(d.p.Shards, d.p.Entities)
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []int
	)
	sem := make(chan struct{}, 16)
	for shard, i := range ents {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			if a := d.call(ctx, i, true, timeout); !a.OK {
				mu.Lock()
				failed = append(failed, shard)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return failed
}

// probeEntities returns, per shard, one entity of the load that lives in
// it (-1 when none does: that shard is not probed).
func probeEntities(shards, entities int) map[int]int {
	out := map[int]int{}
	for i := range entities {
		s := int(sharding.ShardOf(entityID(i), shards))
		if _, ok := out[s]; !ok {
			out[s] = i
		}
	}
	return out
}

// readAll asks every entity for its count (the final state), retrying
// each until it answers or ctx ends; it returns the entities that never
// answered.
func (d *driver) readAll(ctx context.Context) []int {
	return untilAnswered(ctx, d.p.Entities, func(i int) bool { return d.call(ctx, i, true, d.p.AskTimeout).OK })
}

// untilAnswered calls ask for every i in [0, n), 32 at once, each again
// every 100 ms until it returns true or ctx ends; it returns the i whose
// ask never did.
func untilAnswered(ctx context.Context, n int, ask func(i int) bool) []int {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed []int
	)
	sem := make(chan struct{}, 32)
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			for ctx.Err() == nil {
				if ask(i) {
					return
				}
				time.Sleep(100 * time.Millisecond)
			}
			mu.Lock()
			failed = append(failed, i)
			mu.Unlock()
		})
	}
	wg.Wait()
	return failed
}

func (d *driver) stop() error {
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := d.gw.Shutdown(sctx)
	d.gw.Close()
	return errors.Join(err, <-d.run)
}

func (d *driver) all() []ask {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]ask(nil), d.asks...)
}

// reminderPeriod is the period of the counters' reminders.
const reminderPeriod = time.Second

// armReminders makes the first Reminders counters register a periodic
// reminder ("tick", every reminderPeriod), before the faults: Arm is
// idempotent, so each is retried until it succeeds (the cluster just
// converged).
func (d *driver) armReminders(ctx context.Context) error {
	for i := range min(d.p.Reminders, d.p.Entities) {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := runnerproc.Arm.Ask(actx, d.gw, entityID(i), runnerproc.ArmReq{Name: "tick", Period: reminderPeriod})
		cancel()
		if err != nil {
			return fmt.Errorf("arm the reminder of %s: %w", entityID(i), err)
		}
	}
	return nil
}

// touchBeforeStop activates a fresh keeper of a shard the gateway sees
// runnerID own, right before runnerID's graceful stop: its marker's put
// is then likely still queued, and the stop's release must write it, so
// that the shard's next owner runs it (rule 10, part (d)). A touch that
// failed is not checked (it may or may not have activated the keeper).
func (d *driver) touchBeforeStop(ctx context.Context, runnerID string) {
	seq := d.lateTried
	d.lateTried++
	for j := range 4096 {
		id := fmt.Sprintf("late%d-%d", seq, j)
		if owner, _ := d.gw.OwnerOf(sharding.ShardOf(id, d.p.Shards)); owner != runnerID {
			continue
		}
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		resp, err := runnerproc.Touch.Ask(tctx, d.gw, id, runnerproc.TouchReq{})
		cancel()
		if err == nil {
			d.mu.Lock()
			d.late = append(d.late, lateKeeper{id: id, resp: resp, at: runnerproc.Mono()})
			d.mu.Unlock()
		}
		return
	}
}

// lateKeepers returns the keepers touched right before a graceful stop.
func (d *driver) lateKeepers() []lateKeeper {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.late)
}

// touchKeepers activates the Keepers remembered entities, one ask each,
// before the faults (Touch is idempotent; the cluster just converged):
// from then on their shards' owners keep them running without a message
// (rule 10).
func (d *driver) touchKeepers(ctx context.Context) error {
	for i := range d.p.Keepers {
		tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := runnerproc.Touch.Ask(tctx, d.gw, runnerproc.KeeperID(i), runnerproc.TouchReq{})
		cancel()
		if err != nil {
			return fmt.Errorf("touch keeper %s: %w", runnerproc.KeeperID(i), err)
		}
	}
	return nil
}
