package main

import (
	"cmp"
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
	"github.com/shardhost/shardhost/sharding"
)

// Counter is the example's entity: an in-memory count.
type Counter struct {
	id string
	n  int64
}

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

// RelayReq asks a counter to add one to counter To on its behalf. To must
// come after the relaying counter's ID in relayOrder: relays then never
// wait for each other in a cycle (each holds its mailbox while it asks).
type RelayReq struct{ To string }

// relayOrder orders entity IDs shorter first, then lexically: for the
// example's IDs the numeric order (counter-9 before counter-10).
func relayOrder(a, b string) int { return cmp.Or(cmp.Compare(len(a), len(b)), strings.Compare(a, b)) }

// RelayResp is To's new value, the runner that served the relay and the
// one that served To's inc.
type RelayResp struct {
	Value    int64
	Runner   string
	ToRunner string
}

// ErrRelayOrder rejects a relay to a counter whose ID does not come after
// the relaying counter's (relayOrder).
var ErrRelayOrder = errors.New("cluster: relay to a counter whose ID does not come after the relaying one's")

// Relay asks counter req.To to add one, from its handler, through the
// runner hosting it (runner.SenderFrom): with tracing on, the handler's
// context carries its span, so the gateway's ask, this runner's handler
// and To's runner are one trace.
func (c *Counter) Relay(ctx context.Context, req RelayReq) (RelayResp, error) {
	if relayOrder(req.To, c.id) <= 0 {
		return RelayResp{}, fmt.Errorf("%w: %s -> %s", ErrRelayOrder, c.id, req.To)
	}
	s, ok := runner.SenderFrom(ctx)
	if !ok {
		return RelayResp{}, errors.New("cluster: relay outside a runner's handler")
	}
	info, _ := runner.ShardInfoFrom(ctx)
	resp, err := Inc.Ask(ctx, s, req.To, IncReq{})
	if err != nil {
		return RelayResp{}, fmt.Errorf("relay %s -> %s: %w", c.id, req.To, err)
	}
	return RelayResp{Value: resp.Value, Runner: info.Runner, ToRunner: resp.Runner}, nil
}

// The kind and its methods, registered on every process (the gateway needs
// them to route).
var (
	CounterKind = entity.NewKind("counter", func(id string) *Counter { return &Counter{id: id} })
	Inc         = entity.Method(CounterKind, "inc", (*Counter).Inc)
	Relay       = entity.Method(CounterKind, "relay", (*Counter).Relay)
	Remind      = entity.Method(CounterKind, "remind", (*Counter).Remind)
	Later       = entity.Reminder(CounterKind, "later", (*Counter).later)
)

// RemindReq asks a counter to add one after Delay, by a durable reminder:
// stored with its shard, fired by whichever runner owns the shard then.
type RemindReq struct{ Delay time.Duration }

// Remind registers the reminder and answers the count so far.
func (c *Counter) Remind(ctx context.Context, req RemindReq) (IncResp, error) {
	info, _ := runner.ShardInfoFrom(ctx)
	err := Later.Register(ctx, "later", entity.Schedule{First: time.Now().Add(req.Delay)}, 1)
	return IncResp{Value: c.n, Runner: info.Runner}, err
}

// later is the reminder's handler: it adds the tick's payload.
func (c *Counter) later(_ context.Context, tick entity.ReminderTick[int64]) error {
	c.n += tick.Payload
	return nil
}

// askTimeout bounds one ask: asks for a killed runner's shards wait (the
// gateway retries) until the lease expires and another runner owns them.
const askTimeout = 15 * time.Second

// maxInFlight bounds the asks waiting at once (for a killed runner's
// shards, until they have a new owner); beyond it asks are skipped.
const maxInFlight = 20000

// relayCandidates bounds the targets the gateway considers for a relay.
const relayCandidates = 64

// traffic is the gateway's load: asks sent at a steady rate, each on its
// own goroutine (open loop: asks for a dead runner's shards wait without
// holding up the others), and a line of statistics per interval. A share
// of them are relays, each to a counter on another runner than the
// relaying one's when the gateway's view of the shard locks has one.
type traffic struct {
	gw       *runner.Runner
	entities int
	quit     chan struct{}
	wg       sync.WaitGroup
	sem      chan struct{} // one token per ask in flight

	mu      sync.Mutex
	ok      int
	relays  int            // of ok: relays
	across  int            // of relays: served by two runners
	failed  map[string]int // by error class
	skipped int            // not sent: maxInFlight asks were waiting
	lat     []time.Duration
	by      map[string]int // served by runner (a relay: the relaying one)
}

func startTraffic(gw *runner.Runner, rate, relay float64, entities int, every time.Duration, out io.Writer) *traffic {
	t := &traffic{gw: gw, entities: entities, quit: make(chan struct{}), sem: make(chan struct{}, maxInFlight), failed: map[string]int{}, by: map[string]int{}}
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
				to := ""
				if int(float64(sent+1)*relay) > int(float64(sent)*relay) { // relay share of the asks, evenly spread
					to = t.relayTarget(sent % entities)
				}
				t.wg.Go(func() {
					defer func() { <-t.sem }()
					ctx, cancel := context.WithTimeout(context.Background(), askTimeout)
					defer cancel()
					begin := time.Now()
					if to == "" {
						resp, err := Inc.Ask(ctx, gw, id, IncReq{})
						t.record(resp.Runner, "", time.Since(begin), err)
						return
					}
					resp, err := Relay.Ask(ctx, gw, id, RelayReq{To: to})
					t.record(resp.Runner, resp.ToRunner, time.Since(begin), err)
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

// relayTarget returns the counter that counter-i relays to: one of the
// next relayCandidates counters (their IDs come after its own in
// relayOrder) whose shard another runner than counter-i's owns in the
// gateway's view (Runner.OwnerOf), or the next counter when none does or
// an owner is not known yet; "" for the last counter (its ask is a plain
// inc).
func (t *traffic) relayTarget(i int) string {
	if i+1 >= t.entities {
		return ""
	}
	n := t.gw.Config().NumShards
	owner, _ := t.gw.OwnerOf(sharding.ShardOf(fmt.Sprintf("counter-%d", i), n))
	for j := i + 1; j < min(i+1+relayCandidates, t.entities); j++ {
		to := fmt.Sprintf("counter-%d", j)
		if o, _ := t.gw.OwnerOf(sharding.ShardOf(to, n)); owner != "" && o != "" && o != owner {
			return to
		}
	}
	return fmt.Sprintf("counter-%d", i+1)
}

// record counts an ask served by runner id (and a relay's inc by runner to).
func (t *traffic) record(id, to string, d time.Duration, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err != nil {
		t.failed[classify(err)]++
		return
	}
	t.ok++
	t.lat = append(t.lat, d)
	t.by[id]++
	if to != "" {
		t.relays++
		if to != id {
			t.across++
		}
	}
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
	ok, relays, across, failed, lat, by, skipped := t.ok, t.relays, t.across, t.failed, t.lat, t.by, t.skipped
	t.ok, t.relays, t.across, t.failed, t.lat, t.by, t.skipped = 0, 0, 0, map[string]int{}, nil, map[string]int{}, 0
	t.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "gateway: %d asks ok (%.0f/s)", ok, float64(ok)/every.Seconds())
	if relays > 0 {
		fmt.Fprintf(&b, " of which %d relays (%d across two runners)", relays, across)
	}
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
