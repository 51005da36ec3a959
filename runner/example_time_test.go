package runner_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// startExample starts a runner of NumShards shards on the in-memory cluster
// c (storage/etcd in production) hosting kinds, with the workers that
// register adds before Run, and returns it; stop shuts it down.
func startExample(c *memory.Cluster, id string, numShards int, register func(*runner.Runner), kinds ...entity.Descriptor) (r *runner.Runner, stop func()) {
	r, err := runner.New(c.NewStore(id), runner.Config{ID: id, NumShards: numShards,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	for _, k := range kinds {
		if err := r.Register(k); err != nil {
			panic(err)
		}
	}
	if register != nil {
		register(r)
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	return r, func() {
		if err := r.Shutdown(context.Background()); err != nil {
			panic(err)
		}
		<-done
	}
}

// Oven is an entity that schedules messages to itself: a timer (in
// memory, gone with the instance) and a reminder (durable, fired by
// whichever runner owns the entity's shard).
type Oven struct{ out chan<- string }

type BakeReq struct{ Minutes int }

// Bake starts a timer and registers a one-shot reminder, both from the
// entity's own handler: its context says which entity they belong to.
func (o *Oven) Bake(ctx context.Context, r BakeReq) (bool, error) {
	if err := OvenBeep.After(ctx, "beep", 10*time.Millisecond, "preheated"); err != nil {
		return false, err
	}
	// Written in one store transaction fenced by the shard's epoch: a
	// handler whose shard has moved cannot register one.
	due := entity.Schedule{First: time.Now().Add(50 * time.Millisecond)}
	return true, OvenDone.Register(ctx, "done", due, r.Minutes)
}

func (o *Oven) Beep(_ context.Context, t entity.TimerTick[string]) error {
	o.out <- fmt.Sprintf("timer %s, tick %d: %s", t.Name, t.Tick, t.Payload)
	return nil
}

func (o *Oven) Done(_ context.Context, t entity.ReminderTick[int]) error {
	// Redelivered is set only when the previous owner crashed or lost the
	// shard: the tick may have fired there already.
	o.out <- fmt.Sprintf("reminder %s, tick %d after %d minutes, redelivered %t", t.Name, t.Tick, t.Payload, t.Redelivered)
	return nil
}

var (
	ovenOut  = make(chan string, 4)
	OvenKind = entity.NewKind("oven", func(id string) *Oven { return &Oven{out: ovenOut} })
	Bake     = entity.Method(OvenKind, "bake", (*Oven).Bake)
	OvenBeep = entity.Timer(OvenKind, "beep", (*Oven).Beep)
	OvenDone = entity.Reminder(OvenKind, "done", (*Oven).Done)
)

// Timers and reminders are handlers of the kind, typed like methods and
// delivered through the entity's mailbox one at a time with its other
// messages. A timer lives in the runner's memory and ends with the entity's
// instance; a reminder is stored under the entity's shard, fires on the
// shard's owner exactly once across planned moves (at least once after a
// crash, marked Redelivered) and activates the entity if it is not
// resident. docs/time.md has what each guarantees.
func Example_timersAndReminders() {
	c := memory.NewCluster()
	defer c.Close()
	r, stop := startExample(c, "runner-1", 16, nil, OvenKind)
	defer stop()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ok, err := Bake.Ask(ctx, r, "oven-1", BakeReq{Minutes: 40})
	fmt.Println(ok, err)
	fmt.Println(<-ovenOut)
	fmt.Println(<-ovenOut)
	// Output:
	// true <nil>
	// timer beep, tick 1: preheated
	// reminder done, tick 1 after 40 minutes, redelivered false
}
