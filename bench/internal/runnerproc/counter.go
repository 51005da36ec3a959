package runnerproc

import (
	"context"
	"errors"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
)

// The counter: the entity a fault suite drives (Counter, Inc, Get). Each
// instance keeps a count in memory, restores it from its checkpoint when it
// activates, checkpoints it (fenced) every Spec.CheckpointEvery
// increments and in its Release hook, and, when the child has a history
// file, records every activation, handler start and end, checkpoint write
// and release there before the handler returns.

// IncReq asks a counter to add one; Work is how long the handler runs
// before it does (it gives up when its context ends).
type IncReq struct {
	Work time.Duration `json:"work,omitempty"`
}

// GetReq asks a counter for its count.
type GetReq struct{}

// CountResp is a counter's answer: its count after the call and where the
// handler ran (runner, process, epoch, instance).
type CountResp struct {
	Value  int64  `json:"value"`
	Epoch  int64  `json:"epoch"`
	Runner string `json:"runner"`
	PID    int    `json:"pid"`
	Inst   int64  `json:"inst"`
}

// counterChild is what counters need of the child they run in; set once
// by runChild before the runner starts.
var counterChild struct {
	r     *runner.Runner
	hist  *historyFile
	every int
}

var instances atomic.Int64

type counter struct {
	id      string
	n       int64
	inst    int64
	epoch   int64
	since   int // increments since the last checkpoint
	persist func(context.Context, []byte) error
}

// Counter is the counter kind; every child hosts it and a gateway in the
// parent registers it to route it.
var Counter = entity.NewKind("runnerproc-counter", func(id string) *counter { return &counter{id: id} })

// Inc adds one to a counter.
var Inc = entity.Method(Counter, "inc", (*counter).Inc)

// Get reads a counter.
var Get = entity.Method(Counter, "get", (*counter).Get, entity.Idempotent())

// ArmReq registers a periodic reminder of a counter: Name, every Period
// from the registration on.
type ArmReq struct {
	Name   string        `json:"name"`
	Period time.Duration `json:"period"`
}

// Arm registers a reminder of a counter (replacing one of the same name).
var Arm = entity.Method(Counter, "arm", (*counter).Arm, entity.Idempotent())

// Remind is the counters' reminder handler: it records the tick (between
// a handler start and end record, so the checks of handlers apply to it)
// and leaves the count alone.
var Remind = entity.Reminder(Counter, "remind", (*counter).Remind)

func (c *counter) Arm(ctx context.Context, req ArmReq) (bool, error) {
	return true, Remind.Register(ctx, req.Name, entity.Schedule{Period: req.Period}, req.Name)
}

func (c *counter) Remind(ctx context.Context, t entity.ReminderTick[string]) error {
	info := c.start(ctx)
	counterChild.hist.append(Record{Kind: HistFire, Shard: int(info.Shard), Epoch: int64(info.Epoch), Entity: c.id, Inst: c.inst,
		Detail: t.Name, Tick: t.Tick, Missed: t.Missed, Redelivered: t.Redelivered})
	rec := Record{Kind: HistEnd, Shard: int(info.Shard), Epoch: int64(info.Epoch), Entity: c.id, Inst: c.inst, Value: c.n, Detail: TickDetail}
	counterChild.hist.append(rec)
	return nil
}

// TickDetail marks the end record of a reminder tick's handler (no reply
// comes of it).
const TickDetail = "tick"

func (c *counter) Activate(ctx context.Context, info entity.ActivateInfo) error {
	c.inst, c.epoch, c.persist = instances.Add(1), info.Epoch, info.Checkpoint
	if info.Restore != nil {
		data, ok, err := info.Restore(ctx)
		if err != nil {
			return err
		}
		if ok {
			n, err := strconv.ParseInt(string(data), 10, 64)
			if err != nil {
				return errors.New("runnerproc: counter checkpoint is not a number")
			}
			c.n = n
		}
	}
	counterChild.hist.append(Record{Kind: HistActivate, Shard: int(info.Shard), Epoch: info.Epoch, Entity: c.id,
		Inst: c.inst, Value: c.n, Detail: string(info.Reason)})
	return nil
}

func (c *counter) Release(ctx context.Context, info entity.ReleaseInfo) error {
	if info.Checkpoint == nil {
		return nil
	}
	var err error
	for {
		if err = info.Checkpoint(ctx, strconv.AppendInt(nil, c.n, 10)); err == nil || ctx.Err() != nil {
			break
		}
		t := time.NewTimer(50 * time.Millisecond)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	rec := Record{Kind: HistRelease, Shard: int(info.Shard), Epoch: info.Epoch, Entity: c.id, Inst: c.inst, Value: c.n, OK: err == nil}
	if err != nil {
		rec.Err = err.Error()
	}
	counterChild.hist.append(rec)
	return err
}

// start records a handler's start with the runner's lease and deadline.
func (c *counter) start(ctx context.Context) runner.ShardInfo {
	info, _ := runner.ShardInfoFrom(ctx)
	rec := Record{Kind: HistStart, Shard: int(info.Shard), Epoch: int64(info.Epoch), Entity: c.id, Inst: c.inst}
	if r := counterChild.r; r != nil && counterChild.hist != nil {
		st := r.Status()
		rec.Lease = int64(st.Lease)
		if !st.Deadline.IsZero() {
			rec.Deadline = MonoOf(st.Deadline)
		}
	}
	counterChild.hist.append(rec)
	return info
}

func (c *counter) end(info runner.ShardInfo, err error) {
	rec := Record{Kind: HistEnd, Shard: int(info.Shard), Epoch: int64(info.Epoch), Entity: c.id, Inst: c.inst, Value: c.n}
	if err != nil {
		rec.Err = err.Error()
	}
	counterChild.hist.append(rec)
}

func (c *counter) resp(info runner.ShardInfo) CountResp {
	return CountResp{Value: c.n, Epoch: int64(info.Epoch), Runner: info.Runner, PID: os.Getpid(), Inst: c.inst}
}

func (c *counter) Inc(ctx context.Context, req IncReq) (CountResp, error) {
	info := c.start(ctx)
	if req.Work > 0 {
		t := time.NewTimer(req.Work)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			err := context.Cause(ctx)
			c.end(info, err)
			return CountResp{}, err
		}
	}
	c.n++
	c.since++
	if every := counterChild.every; every > 0 && c.since >= every && c.persist != nil {
		err := c.persist(ctx, strconv.AppendInt(nil, c.n, 10))
		rec := Record{Kind: HistCheckpoint, Shard: int(info.Shard), Epoch: c.epoch, Entity: c.id, Inst: c.inst, Value: c.n, OK: err == nil}
		if err != nil {
			rec.Err = err.Error()
		}
		counterChild.hist.append(rec)
		if err != nil {
			c.end(info, err)
			return CountResp{}, err
		}
		c.since = 0
	}
	c.end(info, nil)
	return c.resp(info), nil
}

func (c *counter) Get(ctx context.Context, _ GetReq) (CountResp, error) {
	info := c.start(ctx)
	c.end(info, nil)
	return c.resp(info), nil
}
