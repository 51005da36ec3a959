package main

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// askTimeout bounds each ask. A send to a shard with no reachable owner is
// retried within it, so it must cover a crash takeover (about a lease TTL).
const askTimeout = 10 * time.Second

// Error classes of failed asks, in the order they are tested.
const (
	errMaybeDelivered = "ErrMaybeDelivered" // sent; the handler may have run
	errTimeout        = "DeadlineExceeded"  // never delivered within askTimeout
	errNotOwner       = "*NotOwnerError"    // never delivered
	errOther          = "other"             // e.g. a failed Activate
)

// classify names the class of a failed ask. ErrMaybeDelivered comes first:
// a timeout after the message was sent wraps both it and
// context.DeadlineExceeded, and only it leaves the outcome unknown.
func classify(err error) string {
	var no *runner.NotOwnerError
	switch {
	case errors.Is(err, runner.ErrMaybeDelivered):
		return errMaybeDelivered
	case errors.Is(err, context.DeadlineExceeded):
		return errTimeout
	case errors.As(err, &no):
		return errNotOwner
	default:
		return errOther
	}
}

// tally counts the outcome of asks, per worker and then merged per phase.
type tally struct {
	OK         int64
	Served     map[string]int64 // successful asks by the runner that ran them
	Errors     map[string]int64 // failed asks by class
	Samples    map[string]string
	MaxLatency time.Duration
}

func newTally() tally {
	return tally{Served: map[string]int64{}, Errors: map[string]int64{}, Samples: map[string]string{}}
}

func (t *tally) merge(o tally) {
	t.OK += o.OK
	for k, v := range o.Served {
		t.Served[k] += v
	}
	for k, v := range o.Errors {
		t.Errors[k] += v
	}
	for k, v := range o.Samples {
		if _, ok := t.Samples[k]; !ok {
			t.Samples[k] = v
		}
	}
	t.MaxLatency = max(t.MaxLatency, o.MaxLatency)
}

// Failed is the number of failed asks.
func (t tally) Failed() int64 {
	var n int64
	for _, v := range t.Errors {
		n += v
	}
	return n
}

// traffic drives inc asks through the gateway and remembers, per counter,
// how many were acknowledged and how many ended with an unknown outcome.
type traffic struct {
	gw      *runner.Runner
	workers int
	names   []string
	acked   []atomic.Int64 // acknowledged increments
	maybe   []atomic.Int64 // asks that failed with ErrMaybeDelivered
	next    atomic.Uint64
}

func newTraffic(gw *runner.Runner, counters, workers int) *traffic {
	t := &traffic{gw: gw, workers: workers, names: make([]string, counters),
		acked: make([]atomic.Int64, counters), maybe: make([]atomic.Int64, counters)}
	for i := range t.names {
		t.names[i] = fmt.Sprintf("counter-%d", i)
	}
	return t
}

// start runs the workers until the returned stop is called; stop waits for
// the asks in flight (it never cancels them) and returns their tally.
func (t *traffic) start(ctx context.Context) (stop func() tally) {
	quit := make(chan struct{})
	results := make([]tally, t.workers)
	var wg sync.WaitGroup
	for w := range t.workers {
		wg.Go(func() { results[w] = t.work(ctx, quit) })
	}
	return func() tally {
		close(quit)
		wg.Wait()
		total := newTally()
		for _, r := range results {
			total.merge(r)
		}
		return total
	}
}

func (t *traffic) work(ctx context.Context, quit <-chan struct{}) tally {
	local := newTally()
	for {
		select {
		case <-quit:
			return local
		case <-ctx.Done():
			return local
		default:
		}
		i := int(t.next.Add(1) % uint64(len(t.names)))
		actx, cancel := context.WithTimeout(ctx, askTimeout)
		start := time.Now()
		resp, err := Inc.Ask(actx, t.gw, t.names[i], IncReq{})
		local.MaxLatency = max(local.MaxLatency, time.Since(start))
		cancel()
		if err == nil {
			t.acked[i].Add(1)
			local.OK++
			local.Served[resp.Runner]++
			continue
		}
		class := classify(err)
		if class == errMaybeDelivered {
			t.maybe[i].Add(1)
		}
		local.Errors[class]++
		if _, ok := local.Samples[class]; !ok {
			local.Samples[class] = err.Error()
		}
	}
}

// owners returns the runner owning each counter's shard in the gateway's
// view.
func (t *traffic) owners(numShards int) []string {
	out := make([]string, len(t.names))
	for i, name := range t.names {
		out[i], _ = t.gw.OwnerOf(sharding.ShardOf(name, numShards))
	}
	return out
}

// check is the comparison of every counter's value with the increments the
// client saw acknowledged.
type check struct {
	Counters   int
	Exact      int            // value == acknowledged
	Ambiguous  int            // acknowledged < value <= acknowledged + maybe-delivered
	Lost       int            // value < acknowledged
	LostIncs   int64          // acknowledged increments missing in total
	LostOn     map[string]int // lost counters by owner before the phase's event
	Extra      int            // value > acknowledged + maybe-delivered: must not happen
	Unreadable int            // get failed
}

// verify reads every counter (traffic must be stopped). ownersBefore, when
// not nil, attributes lost counters to the runner that hosted them.
func (t *traffic) verify(ctx context.Context, ownersBefore []string) check {
	c := check{Counters: len(t.names), LostOn: map[string]int{}}
	values := make([]int64, len(t.names))
	failed := make([]bool, len(t.names))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range t.workers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(t.names); i = int(next.Add(1) - 1) {
				gctx, cancel := context.WithTimeout(ctx, askTimeout)
				v, err := Get.Ask(gctx, t.gw, t.names[i], GetReq{})
				cancel()
				values[i], failed[i] = v, err != nil
			}
		})
	}
	wg.Wait()
	for i := range t.names {
		acked, maybe := t.acked[i].Load(), t.maybe[i].Load()
		switch v := values[i]; {
		case failed[i]:
			c.Unreadable++
		case v == acked:
			c.Exact++
		case v < acked:
			c.Lost++
			c.LostIncs += acked - v
			if ownersBefore != nil {
				c.LostOn[ownersBefore[i]]++
			}
		case v <= acked+maybe:
			c.Ambiguous++
		default:
			c.Extra++
		}
	}
	return c
}
