package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
)

// Counter is the example's entity: an in-memory count.
type Counter struct{ n int64 }

// IncReq asks a counter to add one.
type IncReq struct{}

// IncResp is the new value and the runner that served the ask.
type IncResp struct {
	Value  int64
	Runner string
}

// Inc adds one and says where it ran.
func (c *Counter) Inc(ctx context.Context, _ IncReq) (IncResp, error) {
	c.n++
	info, _ := runner.ShardInfoFrom(ctx)
	return IncResp{Value: c.n, Runner: info.Runner}, nil
}

// The kind and its method, registered on every process (the gateway needs
// them to route).
var (
	CounterKind = entity.NewKind("counter", func(string) *Counter { return &Counter{} })
	Inc         = entity.Method(CounterKind, "inc", (*Counter).Inc)
)

// askTimeout bounds one ask: asks for a killed runner's shards wait (the
// gateway retries) until the lease expires and another runner owns them.
const askTimeout = 15 * time.Second

// maxInFlight bounds the asks waiting at once (for a killed runner's
// shards, until they have a new owner); beyond it asks are skipped.
const maxInFlight = 20000

// traffic is the gateway's load: asks sent at a steady rate, each on its
// own goroutine (open loop: asks for a dead runner's shards wait without
// holding up the others), and a line of statistics per interval.
type traffic struct {
	quit chan struct{}
	wg   sync.WaitGroup
	sem  chan struct{} // one token per ask in flight

	mu      sync.Mutex
	ok      int
	failed  map[string]int // by error class
	skipped int            // not sent: maxInFlight asks were waiting
	lat     []time.Duration
	by      map[string]int // served by runner
}

func startTraffic(gw *runner.Runner, rate float64, entities int, every time.Duration, out io.Writer) *traffic {
	t := &traffic{quit: make(chan struct{}), sem: make(chan struct{}, maxInFlight), failed: map[string]int{}, by: map[string]int{}}
	t.wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		start, sent := time.Now(), 0
		for {
			select {
			case <-t.quit:
				return
			case <-tick.C:
			}
			for due := int(time.Since(start).Seconds() * rate); sent < due; sent++ {
				select {
				case t.sem <- struct{}{}:
				default:
					t.mu.Lock()
					t.skipped++
					t.mu.Unlock()
					continue
				}
				id := fmt.Sprintf("counter-%d", sent%entities)
				t.wg.Go(func() {
					defer func() { <-t.sem }()
					ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
					defer cancel()
					begin := time.Now()
					resp, err := Inc.Ask(ctx, gw, id, IncReq{})
					t.record(resp, time.Since(begin), err)
				})
			}
		}
	})
	t.wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-t.quit:
				return
			case <-tick.C:
				fmt.Fprintln(out, t.line(every))
			}
		}
	})
	return t
}

func (t *traffic) record(resp IncResp, d time.Duration, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.failed[classify(err)]++
		return
	}
	t.ok++
	t.lat = append(t.lat, d)
	t.by[resp.Runner]++
}

func classify(err error) string {
	var notOwner *runner.NotOwnerError
	switch {
	case errors.Is(err, runner.ErrMaybeDelivered):
		return "maybe-delivered"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.As(err, &notOwner):
		return "not-owner"
	default:
		return "other"
	}
}

// line sums up the interval just ended and starts a new one.
func (t *traffic) line(every time.Duration) string {
	t.mu.Lock()
	ok, failed, lat, by, skipped := t.ok, t.failed, t.lat, t.by, t.skipped
	t.ok, t.failed, t.lat, t.by, t.skipped = 0, map[string]int{}, nil, map[string]int{}, 0
	t.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "gateway: %d asks ok (%.0f/s)", ok, float64(ok)/every.Seconds())
	if n := len(t.sem); n > 100 {
		fmt.Fprintf(&b, ", %d waiting", n)
	}
	if skipped > 0 {
		fmt.Fprintf(&b, ", %d skipped", skipped)
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		q := func(f float64) time.Duration { return lat[int(f*float64(len(lat)-1))].Round(10 * time.Microsecond) }
		fmt.Fprintf(&b, ", p50 %v p99 %v max %v", q(0.5), q(0.99), lat[len(lat)-1].Round(10*time.Microsecond))
	}
	nf := 0
	for _, n := range failed {
		nf += n
	}
	fmt.Fprintf(&b, ", %d failed", nf)
	for _, c := range slices.Sorted(maps.Keys(failed)) {
		fmt.Fprintf(&b, " %s=%d", c, failed[c])
	}
	if len(by) > 0 {
		b.WriteString("; served by")
		for _, id := range slices.Sorted(maps.Keys(by)) {
			fmt.Fprintf(&b, " %s %d%%", id, by[id]*100/max(ok, 1))
		}
	}
	return b.String()
}

// stop ends the traffic (asks in flight finish, each within askTimeout).
func (t *traffic) stop() {
	close(t.quit)
	t.wg.Wait()
}
