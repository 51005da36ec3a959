package runner_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// Counter is an entity: plain state, methods with typed requests.
type Counter struct{ n int64 }

type IncReq struct{ By int64 }
type ResetReq struct{}

func (c *Counter) Inc(_ context.Context, r IncReq) (int64, error) { c.n += r.By; return c.n, nil }
func (c *Counter) Reset(_ context.Context, _ ResetReq) error      { c.n = 0; return nil }

var (
	CounterKind = entity.NewKind("counter", func(id string) *Counter { return &Counter{} },
		entity.IdleAfter(2*time.Minute), entity.Mailbox(1024))
	Inc   = entity.Method(CounterKind, "inc", (*Counter).Inc)
	Reset = entity.Signal(CounterKind, "reset", (*Counter).Reset)
)

// A runner on the in-memory store hosting counters: Ask waits for the
// response, Tell only enqueues.
func Example() {
	store := memory.New() // storage/etcd in production
	defer store.Cluster().Close()
	r, err := runner.New(store, runner.Config{ID: "runner-1", NumShards: 64, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		panic(err)
	}
	if err := r.Register(CounterKind); err != nil {
		panic(err)
	}
	go r.Run(context.Background()) // sends made before Run has started wait for it
	defer r.Shutdown(context.Background())
	<-r.Ready() // registered (not needed before sending; shards are acquired next)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// Retried inside Ask until the runner owns the counter's shard.
	n, err := Inc.Ask(ctx, r, "counter-42", IncReq{By: 1})
	fmt.Println(n, err)
	n, _ = Inc.Ask(ctx, r, "counter-42", IncReq{By: 41})
	fmt.Println(n)
	_ = Reset.Tell(ctx, r, "counter-42", ResetReq{})
	n, _ = Inc.Ask(ctx, r, "counter-42", IncReq{By: 1})
	fmt.Println(n)
	// Output:
	// 1 <nil>
	// 42
	// 1
}

// Errors a sender may retry and errors it must not.
func ExampleNotOwnerError() {
	err := error(&runner.NotOwnerError{Shard: 7, OwnerHint: "runner-2"})
	var no *runner.NotOwnerError
	if errors.As(err, &no) {
		fmt.Println("not delivered; owner is", no.OwnerHint)
	}
	_, err = Inc.Ask(context.Background(), failingSender{entity.ErrMailboxFull}, "c", IncReq{})
	fmt.Println(errors.Is(err, entity.ErrMailboxFull))
	// Output:
	// not delivered; owner is runner-2
	// true
}

type failingSender struct{ err error }

func (f failingSender) Send(context.Context, entity.Call) (any, error) { return nil, f.err }
