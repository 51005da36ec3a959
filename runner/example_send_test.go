package runner_test

import (
	"context"
	"fmt"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
)

// A Ref is a handle on one entity for a sender that calls it often: a call
// through it is a call by ID — the same retries, at most once, the same
// errors — that skips the hash of the ID and the lookups while the entity
// is resident on this runner, and goes by ID whenever it is not.
func ExampleRunner_Ref() {
	c := memory.NewCluster()
	defer c.Close()
	r, stop := startExample(c, "runner-1", 16, nil, CounterKind)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ref := r.Ref(CounterKind, "counter-7")
	for range 3 {
		n, err := Inc.Ask(ctx, ref, "counter-7", IncReq{By: 2})
		fmt.Println(n, err)
	}
	// Output:
	// 2 <nil>
	// 4 <nil>
	// 6 <nil>
}

// AskAsync and TellAsync return at once: a goroutine of the runner sends
// the call, bounded by the timeout, and reports the outcome to the
// callback. Sends made one after another this way may arrive in any order.
func ExampleRunner_SendAsync() {
	c := memory.NewCluster()
	defer c.Close()
	r, stop := startExample(c, "runner-1", 16, nil, CounterKind)
	defer stop()

	answered := make(chan string, 1)
	Inc.AskAsync(r, "counter-9", IncReq{By: 5}, 10*time.Second, func(n int64, err error) {
		answered <- fmt.Sprint(n, " ", err) // on the runner's goroutine: do not block here
	})
	fmt.Println(<-answered)
	// Output:
	// 5 <nil>
}

// Relay is an entity that sends to other entities from its handlers.
type Relay struct{}

type RelayReq struct {
	To string
	By int64
}

// Forward asks a counter and waits for its answer: the relay's mailbox
// waits too, for as long as the counter's shard has no live owner (about
// LeaseTTL after a crash of its runner), bounded by the asker's deadline
// if it has one. Notify does not wait at all.
func (*Relay) Forward(ctx context.Context, r RelayReq) (int64, error) {
	s, ok := runner.SenderFrom(ctx) // the runner hosting this handler: no runner in a global
	if !ok {
		return 0, fmt.Errorf("not called by a runner")
	}
	return Inc.Ask(ctx, s, r.To, IncReq{By: r.By})
}

func (*Relay) Notify(ctx context.Context, r RelayReq) error {
	s, _ := runner.SenderFrom(ctx)
	Inc.AskAsync(s, r.To, IncReq{By: r.By}, time.Second, func(n int64, err error) {
		relayed <- fmt.Sprint("notified: ", n, " ", err)
	})
	return nil
}

var (
	relayed     = make(chan string, 1)
	RelayKind   = entity.NewKind("relay", func(id string) *Relay { return &Relay{} })
	RelayAsk    = entity.Method(RelayKind, "forward", (*Relay).Forward)
	RelayNotify = entity.Signal(RelayKind, "notify", (*Relay).Notify)
)

// A handler sends to other entities with the runner its context carries.
// A synchronous Ask or Tell holds the handler, and its entity's mailbox,
// until it returns; AskAsync and TellAsync do not (use them for cycles,
// and from signal handlers, whose context has no deadline).
func ExampleSenderFrom() {
	c := memory.NewCluster()
	defer c.Close()
	r, stop := startExample(c, "runner-1", 16, nil, CounterKind, RelayKind)
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	n, err := RelayAsk.Ask(ctx, r, "relay-1", RelayReq{To: "counter-3", By: 3})
	fmt.Println("forwarded:", n, err)
	if err := RelayNotify.Tell(ctx, r, "relay-1", RelayReq{To: "counter-3", By: 4}); err != nil {
		panic(err)
	}
	fmt.Println(<-relayed)
	// Output:
	// forwarded: 3 <nil>
	// notified: 7 <nil>
}
