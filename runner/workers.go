package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner/internal/hosting"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// ErrDuplicateWorker: a shard worker or singleton name was registered
// twice with different functions (or as both).
var ErrDuplicateWorker = errors.New("runner: worker or singleton registered twice")

// WorkerFunc is a shard worker's or a singleton's body. It runs until ctx
// ends — at the detach instant, when the shard is released or handed off
// (cause ErrDetached, ErrShardMoved, ErrShutdown, as for handlers) — or
// until it returns: nil ends it for this ownership of the shard; an error
// or a panic restarts it after a back-off (100 ms doubling to 30 s,
// counted in sharding.worker_restarts). ctx carries the ShardInfo.
type WorkerFunc func(ctx context.Context, w Work) error

// Work is what a worker runs for.
type Work struct {
	Name      string
	Singleton bool
	Shard     sharding.ShardID
	// Epoch is the shard's ownership epoch on this runner: a fencing
	// token. A worker writing to a system outside shardhost passes it
	// along, and that system refuses writes with an older epoch than one
	// it has seen (the writes of a zombie instance that ignored its
	// cancelled context).
	Epoch  storage.Epoch
	Runner string
}

// RunPerShard registers fn as the shard worker name: one instance per
// shard this runner owns, started when the shard is acquired (on a
// planned move: once the handoff completed, after the warm hooks) and
// stopped before its release completes — a handoff moves the lock only
// after the worker returned (a worker ignoring its context delays the
// cutover like a handler does), a plain release keeps the lock until it
// returns — and at the detach instant. Register it on every runner, before
// Run (ErrAlreadyRunning after); registering the same name and function
// again is a no-op, another function ErrDuplicateWorker.
func (r *Runner) RunPerShard(name string, fn WorkerFunc) error {
	return r.addWorker(name, fn, false)
}

// RunSingleton registers fn as the singleton name: exactly one instance in
// the cluster, running on the owner of the shard SingletonShard(name)
// maps to, with the lifecycle of a shard worker: on a planned move the
// new owner starts it only after the old one's returned; after a crash it
// runs again once the shard is re-owned (about LeaseTTL later); never two
// at once among instances that respect their context. Work.Epoch is the
// fencing token for the writes it makes elsewhere. Singletons of
// different names spread over the runners by the assignment. Register it
// on every runner (a runner without it never runs it), before Run.
func (r *Runner) RunSingleton(name string, fn WorkerFunc) error {
	return r.addWorker(name, fn, true)
}

// SingletonShard returns the shard singleton name runs on, in a cluster of
// numShards shards.
func SingletonShard(name string, numShards int) sharding.ShardID {
	return sharding.ShardOf("singleton/"+name, numShards)
}

type workerReg struct {
	name      string
	fn        WorkerFunc
	singleton bool
}

func (r *Runner) addWorker(name string, fn WorkerFunc, singleton bool) error {
	if err := entity.ValidTimerName(name); err != nil || fn == nil {
		return fmt.Errorf("%w: worker %q: a name of 1-128 bytes of UTF-8 and a function", ErrInvalidConfig, name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lifecycle.ran() {
		return fmt.Errorf("%w: register worker %q before Run", ErrAlreadyRunning, name)
	}
	for _, w := range r.workerRegs {
		if w.name != name {
			continue
		}
		if w.singleton == singleton && reflect.ValueOf(w.fn).Pointer() == reflect.ValueOf(fn).Pointer() {
			return nil
		}
		return fmt.Errorf("%w: %q", ErrDuplicateWorker, name)
	}
	r.workerRegs = append(r.workerRegs, workerReg{name: name, fn: fn, singleton: singleton})
	return nil
}

// installWorkers hands the registered workers to the entity host (Run, before
// any shard is hosted).
func (r *Runner) installWorkers() {
	r.mu.Lock()
	regs := r.workerRegs
	r.mu.Unlock()
	ws := make([]hosting.Worker, 0, len(regs))
	for _, reg := range regs {
		shard := -1
		if reg.singleton {
			shard = int(SingletonShard(reg.name, r.cfg.NumShards))
		}
		ws = append(ws, hosting.Worker{
			Name: reg.name, Shard: shard,
			Run: func(ctx context.Context, id sharding.ShardID, epoch storage.Epoch) error {
				return reg.fn(ctx, Work{Name: reg.name, Singleton: reg.singleton, Shard: id, Epoch: epoch, Runner: r.cfg.ID})
			},
			Started: func(id sharding.ShardID, epoch storage.Epoch) {
				if reg.singleton {
					select {
					case r.singletons.queue <- storage.SingletonRecord{Shard: id, Name: reg.name, Runner: r.cfg.ID, Started: time.Now().UTC(), Epoch: epoch}:
					default:
						r.log.Warn("singleton record not written: too many queued", "singleton", reg.name, "shard", id)
					}
				}
				r.hub.Publish(WorkerStarted{EventBase: r.base(), Name: reg.name, Singleton: reg.singleton, Shard: id, Epoch: epoch})
			},
			Stopped: func(id sharding.ShardID, epoch storage.Epoch, err error) {
				r.hub.Publish(WorkerStopped{EventBase: r.base(), Name: reg.name, Singleton: reg.singleton, Shard: id, Epoch: epoch, Err: err})
			},
		})
	}
	r.hosting.SetWorkers(ws)
}

// singletonRecordTimeout bounds each write of a singleton's record (it is
// for operators: a failed write is logged and tried again);
// singletonRecQueue bounds the records waiting to be written; a record
// whose write failed is tried again after singletonRecordRetry, doubling up
// to singletonRecordRetryMax.
const (
	singletonRecordTimeout  = 500 * time.Millisecond
	singletonRecQueue       = 256
	singletonRecordRetry    = 500 * time.Millisecond
	singletonRecordRetryMax = 5 * time.Second
)

// singletonRecorder writes the singletons' records (singletons/{shard}/{name},
// fenced by their epochs) queued when they start, in the background: a
// singleton starts without waiting for its record. A write that failed
// for another reason than fencing (etcd slow or unreachable) is tried
// again, with a growing back-off, while the runner stays attached: a
// record lost to one slow write would leave its singleton unlisted until
// it moves. A fenced write means the shard moved on: its new owner records
// its own.
type singletonRecorder struct {
	queue      chan storage.SingletonRecord // singletons started, their records to write
	store      storage.Store
	log        *slog.Logger
	attachment func() context.Context // the current attachment's context (nil: none)
}

// run writes the queued records until ctx ends.
func (s *singletonRecorder) run(ctx context.Context) {
	var pending []storage.SingletonRecord
	backoff := singletonRecordRetry
	retry := time.NewTimer(backoff)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case rec := <-s.queue:
			pending = append(pending, rec)
		case <-retry.C:
		}
		failed := pending[:0]
		for _, rec := range pending {
			if s.record(rec, len(failed) == 0 && backoff == singletonRecordRetry) {
				failed = append(failed, rec)
			}
		}
		clear(pending[len(failed):])
		pending = failed
		switch {
		case len(pending) == 0:
			backoff = singletonRecordRetry
			retry.Stop()
		default:
			retry.Reset(backoff)
			backoff = min(2*backoff, singletonRecordRetryMax)
		}
	}
}

// record writes rec, fenced by rec.Epoch, and reports whether to
// try again (the write failed, not fenced, and the runner is attached). It
// logs a failure when warn is set (the first of a series).
func (s *singletonRecorder) record(rec storage.SingletonRecord, warn bool) (again bool) {
	actx := s.attachment()
	if actx == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(actx, singletonRecordTimeout)
	defer cancel()
	res, err := s.store.WriteShardStates(ctx, []storage.ShardWrite{{Shard: rec.Shard, Epoch: rec.Epoch, PutSingletons: []storage.SingletonRecord{rec}}})
	if len(res) == 1 {
		err = res[0].Err
	}
	if err == nil || actx.Err() != nil || errors.Is(err, storage.ErrFenced) {
		return false
	}
	if warn {
		s.log.Warn("cannot record where a singleton runs; trying again", "singleton", rec.Name, "shard", rec.Shard, "err", err)
	}
	return true
}
