package runnerproc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
)

// Always-on work: the singletons and the shard worker a child runs
// (Spec.Singletons, Spec.ShardWorker) and the remembered kind [Keeper].
// Each records its own runs in the history file — a worker body its start
// (HistRun) and its return (HistRunEnd), a keeper each life from its
// Activate (HistLife) to its Release hook or the end of its context,
// whichever comes first (HistLifeEnd) — so a checker can tell, from the
// instances themselves, whether two ever ran at once.

// ShardWorkerName is the name of the shard worker a child runs
// (Spec.ShardWorker).
const ShardWorkerName = "worker"

// SingletonName is the name of the i-th singleton a child runs
// (Spec.Singletons).
func SingletonName(i int) string { return fmt.Sprint("singleton-", i) }

// KeeperID is the ID of the i-th keeper a driver activates.
func KeeperID(i int) string { return fmt.Sprint("k", i) }

// Detail of a HistRun record: what ran.
const (
	RunSingleton = "singleton"
	RunWorker    = "worker"
)

// Classes of the cause that ended a run or a life (the Detail of
// HistRunEnd and HistLifeEnd records; Err holds the cause itself).
const (
	EndMoved    = "moved"    // ErrShardMoved: a handoff, a plain release, a lost lock
	EndShutdown = "shutdown" // ErrShutdown
	EndDetached = "detached" // ErrDetached
	EndOther    = "other"
)

// EndClass returns the class of the cause that ended a run or a life.
func EndClass(cause error) string {
	switch {
	case errors.Is(cause, runner.ErrShardMoved):
		return EndMoved
	case errors.Is(cause, runner.ErrShutdown):
		return EndShutdown
	case errors.Is(cause, runner.ErrDetached):
		return EndDetached
	default:
		return EndOther
	}
}

// runs numbers the runs and lives of this process (the Inst of their
// records).
var runs atomic.Int64

// alwaysChild is the history the workers and keepers record in; set once
// by runChild before the runner starts.
var alwaysChild struct {
	hist *historyFile
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// alwaysWorker is the body of the singletons and the shard worker: it
// records its start (with its context's cause if that had already ended),
// runs until its context ends, records its return and returns nil.
func alwaysWorker(ctx context.Context, w runner.Work) error {
	n := runs.Add(1)
	what := RunWorker
	if w.Singleton {
		what = RunSingleton
	}
	rec := Record{Kind: HistRun, Shard: int(w.Shard), Epoch: int64(w.Epoch), Entity: w.Name, Inst: n, Detail: what}
	if ctx.Err() != nil {
		rec.Err = errString(context.Cause(ctx))
	}
	alwaysChild.hist.append(rec)
	<-ctx.Done()
	cause := context.Cause(ctx)
	alwaysChild.hist.append(Record{Kind: HistRunEnd, Shard: int(w.Shard), Epoch: int64(w.Epoch), Entity: w.Name, Inst: n,
		Detail: EndClass(cause), Err: errString(cause)})
	return nil
}

// installAlways registers the spec's singletons and shard worker on r.
func installAlways(r *runner.Runner, spec Spec) error {
	if spec.ShardWorker {
		if err := r.RunPerShard(ShardWorkerName, alwaysWorker); err != nil {
			return err
		}
	}
	for i := range spec.Singletons {
		if err := r.RunSingleton(SingletonName(i), alwaysWorker); err != nil {
			return err
		}
	}
	return nil
}

// TouchReq activates a keeper (its first activation makes it remembered).
type TouchReq struct{}

// TouchResp says where a keeper lives.
type TouchResp struct {
	Runner string `json:"runner"`
	Shard  int    `json:"shard"`
	Epoch  int64  `json:"epoch"`
}

type keeper struct {
	id  string
	cur *life // the current life (Activate sets it)
}

// life is one life of a keeper: its end is recorded once.
type life struct {
	rec  Record
	once sync.Once
}

func (l *life) end(cause error) {
	l.once.Do(func() {
		rec := l.rec
		rec.Kind, rec.Mono, rec.Detail, rec.Err = HistLifeEnd, 0, EndClass(cause), errString(cause)
		alwaysChild.hist.append(rec)
	})
}

// Keeper is a remembered kind (entity.Remembered): once touched, a keeper
// is kept running by its shard's owner, without messages, wherever its
// shard goes. Every child hosts it; a gateway in the parent registers it
// to route Touch.
var Keeper = entity.NewKind("runnerproc-keeper", func(id string) *keeper { return &keeper{id: id} }, entity.Remembered())

// Touch activates a keeper and says where it lives.
var Touch = entity.Method(Keeper, "touch", (*keeper).Touch, entity.Idempotent())

func (k *keeper) Touch(ctx context.Context, _ TouchReq) (TouchResp, error) {
	info, _ := runner.ShardInfoFrom(ctx)
	return TouchResp{Runner: info.Runner, Shard: int(info.Shard), Epoch: int64(info.Epoch)}, nil
}

// Activate records the start of a life, and its end when the entity's
// context ends (a detach, a lost shard) unless Release records it first.
func (k *keeper) Activate(ctx context.Context, info entity.ActivateInfo) error {
	l := &life{rec: Record{Kind: HistLife, Shard: int(info.Shard), Epoch: info.Epoch, Entity: k.id, Inst: runs.Add(1),
		Detail: string(info.Reason)}}
	start := l.rec
	if ctx.Err() != nil {
		start.Err = errString(context.Cause(ctx))
	}
	alwaysChild.hist.append(start)
	k.cur = l
	context.AfterFunc(ctx, func() { l.end(context.Cause(ctx)) })
	return nil
}

// Release records the end of the life (a planned move, a shutdown).
func (k *keeper) Release(_ context.Context, info entity.ReleaseInfo) error {
	if k.cur != nil {
		k.cur.end(info.Reason)
	}
	return nil
}
