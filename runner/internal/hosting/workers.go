package hosting

import (
	"context"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// Workers: long-running functions the host runs for its shards — one per
// hosted shard (shard workers) or for one shard only (a singleton, on the
// owner of the shard its name maps to). A worker is part of its shard's
// hosting like a running handler: it counts in Running, so a drain waits
// for it (a handoff's cutover is given up while it runs, a plain release
// keeps its lock until it returns), and it runs under the shard's context
// (ended with the ownership: detach, loss, release). A drain first cancels
// the workers' own context with the drain's cause.

// Worker describes one worker. Shard is -1 for a shard worker (every
// hosted shard), else the one shard a singleton runs on.
type Worker struct {
	Name  string
	Shard int
	Run   func(ctx context.Context, shard sharding.ShardID, epoch storage.Epoch) error
	// Started and Stopped, if set, are called on the worker's goroutine
	// around each run of Run (Stopped with its error or panic).
	Started func(shard sharding.ShardID, epoch storage.Epoch)
	Stopped func(shard sharding.ShardID, epoch storage.Epoch, err error)
}

// Worker restart back-off after Run failed while its shard is still
// hosted: from minWorkerBackoff, doubling, to maxWorkerBackoff.
const (
	minWorkerBackoff = 100 * time.Millisecond
	maxWorkerBackoff = 30 * time.Second
)

// SetWorkers sets the workers every shard hosted from now on runs.
func (h *Host) SetWorkers(ws []Worker) {
	h.kindsMu.Lock()
	defer h.kindsMu.Unlock()
	h.workers = ws
}

// workerSlot is one worker of one hosted shard.
type workerSlot struct {
	w       Worker
	want    bool // should run (the shard serves); under sh.mu
	running bool // its goroutine lives; under sh.mu
	// finished: Run returned nil, which ends it for this ownership of
	// the shard (a given-up cutover does not start it again); under sh.mu
	finished bool
	since    time.Time // when the current run started; under sh.mu
	cancel   context.CancelCauseFunc
}

// StartWorkers starts the shard's workers (after Install, and again after
// a cutover is given up: Reopen does it). A worker whose previous run
// still has its goroutine starts when that one returns.
func (sh *Shard) StartWorkers() {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.startWorkersLocked()
}

func (sh *Shard) startWorkersLocked() {
	if sh.slots == nil {
		sh.h.kindsMu.Lock()
		ws := sh.h.workers
		sh.h.kindsMu.Unlock()
		for _, w := range ws {
			if w.Shard < 0 || sharding.ShardID(w.Shard) == sh.id {
				sh.slots = append(sh.slots, &workerSlot{w: w})
			}
		}
	}
	for _, s := range sh.slots {
		if s.finished {
			continue
		}
		s.want = true
		if !s.running {
			sh.runWorkerLocked(s)
		}
	}
}

// stopWorkersLocked cancels the shard's workers with cause.
func (sh *Shard) stopWorkersLocked(cause error) {
	for _, s := range sh.slots {
		s.want = false
		if s.cancel != nil {
			s.cancel(cause)
		}
	}
}

// runWorkerLocked starts s's goroutine (counted in running).
func (sh *Shard) runWorkerLocked(s *workerSlot) {
	ctx, cancel := context.WithCancelCause(sh.ctx)
	s.running, s.cancel, s.since = true, cancel, time.Now()
	sh.workers.Add(1)
	sh.running.Add(1)
	go sh.worker(ctx, s)
}

// worker runs s until its context ends or Run returns nil (finished for
// this ownership); a failed run (an error or a panic) restarts after a
// growing back-off.
func (sh *Shard) worker(ctx context.Context, s *workerSlot) {
	finished := false
	defer func() { sh.workerDone(s, finished) }()
	if !sh.waitPrevWorkers(ctx, s) {
		return
	}
	backoff := minWorkerBackoff
	for ctx.Err() == nil && !sh.h.env.PastDetach() {
		if s.w.Started != nil {
			s.w.Started(sh.id, sh.epoch)
		}
		err := runWorker(ctx, s.w, sh.id, sh.epoch)
		if s.w.Stopped != nil {
			s.w.Stopped(sh.id, sh.epoch, err)
		}
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			finished = true
			return
		}
		sh.h.met.WorkerRestarts.Add(context.Background(), 1, sh.h.met.Attrs)
		sh.h.log.Warn("worker failed; restarting it", "worker", s.w.Name, "shard", sh.id, "in", backoff, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		backoff = min(2*backoff, maxWorkerBackoff)
	}
}

// waitPrevWorkers waits until the workers of the shard's previous host on
// this runner (an ownership that ended, its workers cancelled) have
// returned: a shard's worker never runs twice at once, also when the shard
// comes back to this runner at once (a lock rewritten behind its back and
// acquired again). It reports false when ctx ended first. A previous
// worker that ignores its context holds this one back (logged once per
// DrainTimeout).
func (sh *Shard) waitPrevWorkers(ctx context.Context, s *workerSlot) bool {
	p := sh.prev
	if p == nil {
		return true
	}
	warned := time.Now()
	for p.workers.Load() > 0 {
		if time.Since(warned) >= sh.h.cfg.DrainTimeout {
			warned = time.Now()
			sh.h.log.Warn("a worker of the shard's previous epoch on this runner still runs (it ignores its cancelled context); this epoch's worker waits for it",
				"worker", s.w.Name, "shard", sh.id)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(time.Millisecond):
		}
	}
	return true
}

// runWorker calls w.Run, turning a panic into an error.
func runWorker(ctx context.Context, w Worker, shard sharding.ShardID, epoch storage.Epoch) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("worker %s panicked: %v\n%s", w.Name, p, debug.Stack())
		}
	}()
	return w.Run(ctx, shard, epoch)
}

// workerDone ends s's goroutine: it leaves the running count, and starts
// again if the shard wants it running meanwhile (a cutover was given up
// while it still ran).
func (sh *Shard) workerDone(s *workerSlot, finished bool) {
	sh.mu.Lock()
	s.running = false
	if finished {
		s.finished, s.want = true, false
	}
	s.cancel(nil)
	again := s.want && sh.admitting && sh.ctx.Err() == nil
	if again {
		sh.runWorkerLocked(s)
	}
	sh.mu.Unlock()
	sh.stopped(true)
}

// WorkerRun is a running worker of a shard (Workers).
type WorkerRun struct {
	Name      string
	Singleton bool
	Since     time.Time // when its goroutine started
}

// Workers returns the shard's workers whose goroutine runs.
func (sh *Shard) Workers() []WorkerRun {
	sh.mu.RLock()
	defer sh.mu.RUnlock()
	var out []WorkerRun
	for _, s := range sh.slots {
		if s.running {
			out = append(out, WorkerRun{Name: s.w.Name, Singleton: s.w.Shard >= 0, Since: s.since})
		}
	}
	return out
}
