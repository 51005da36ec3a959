package runner_test

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
)

// A singleton runs once in the cluster, on the owner of the shard its name
// maps to, under that shard's context: it ends at a planned move (the new
// owner starts its instance only after this one returned), at the detach
// instant and at shutdown. Work.Epoch is the fencing token to pass along
// with every write it makes outside shardhost. Register it on every runner,
// before Run.
func ExampleRunner_RunSingleton() {
	c := memory.NewCluster()
	defer c.Close()
	started := make(chan runner.Work, 1)
	_, stop := startExample(c, "runner-1", 16, func(r *runner.Runner) {
		err := r.RunSingleton("billing-cycle", func(ctx context.Context, w runner.Work) error {
			started <- w
			<-ctx.Done() // the shard moved or was released, the detach instant came, or Shutdown
			return nil   // nil: done for this ownership of the shard; an error restarts it after a back-off
		})
		if err != nil {
			panic(err)
		}
	})
	defer stop()

	w := <-started
	fmt.Println(w.Name, "runs on", w.Runner)
	fmt.Println("its shard is SingletonShard's:", w.Shard == runner.SingletonShard("billing-cycle", 16))
	fmt.Println("fencing token above 0:", w.Epoch > 0)
	// Output:
	// billing-cycle runs on runner-1
	// its shard is SingletonShard's: true
	// fencing token above 0: true
}

// A shard worker runs once per owned shard, with the same lifecycle as a
// singleton: a consumer of each shard's partition of a log, say.
func ExampleRunner_RunPerShard() {
	c := memory.NewCluster()
	defer c.Close()
	started := make(chan sharding.ShardID, 4)
	_, stop := startExample(c, "runner-1", 4, func(r *runner.Runner) {
		err := r.RunPerShard("consume", func(ctx context.Context, w runner.Work) error {
			started <- w.Shard
			<-ctx.Done()
			return nil
		})
		if err != nil {
			panic(err)
		}
	})
	defer stop()

	var shards []sharding.ShardID
	for range 4 {
		shards = append(shards, <-started)
	}
	slices.Sort(shards)
	fmt.Println("consumers of shards", shards)
	// Output:
	// consumers of shards [0 1 2 3]
}

// Twin is an always-on entity: once activated, its shard's owner keeps it
// running, without a message, until it calls entity.Forget.
type Twin struct{ out chan<- string }

type PingReq struct{}

func (t *Twin) Activate(_ context.Context, info entity.ActivateInfo) error {
	t.out <- fmt.Sprintf("%s activated: %s", info.Entity, info.Reason)
	return nil
}

func (t *Twin) Ping(context.Context, PingReq) (bool, error) { return true, nil }

var (
	twinOut  = make(chan string, 4)
	TwinKind = entity.NewKind("twin", func(id string) *Twin { return &Twin{out: twinOut} }, entity.Remembered())
	TwinPing = entity.Method(TwinKind, "ping", (*Twin).Ping)
)

// A remembered entity is recorded once, at its first activation (one
// fenced write, batched with other shards'; none per message), and
// activated without a message by whichever runner owns its shard next —
// after a planned move, a crash or, here, a restart of the whole cluster.
func Example_rememberedEntity() {
	c := memory.NewCluster()
	defer c.Close()
	r, stop := startExample(c, "runner-1", 16, nil, TwinKind)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := TwinPing.Ask(ctx, r, "pump-7", PingReq{}); err != nil {
		panic(err)
	}
	fmt.Println(<-twinOut)
	stop()

	// A new runner on the same store: nobody sends to pump-7.
	_, stop = startExample(c, "runner-2", 16, nil, TwinKind)
	defer stop()
	fmt.Println(<-twinOut)
	// Output:
	// pump-7 activated: new
	// pump-7 activated: remembered
}
