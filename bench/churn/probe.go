package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// The first ask after a crash: from the crash on, one prober per shard the
// crashed runner owned asks an entity of that shard through the gateway
// until a runner other than the crashed one answers. The report sets the
// instant of that answer against the new owner's ShardAcquired: what a
// caller waits, after its shard is re-owned, for the gateway to learn the
// new route and for a pending dial or back-off aimed at the dead runner to
// give way.

// probeTimeout bounds one probe ask (it retries internally until then).
const probeTimeout = 10 * time.Second

// probeWait bounds how long a crash step waits, once settled, for its
// probes to be answered.
const probeWait = 10 * time.Second

// firstAsk is a probe's result: shard's first answer by a new owner after
// the crash at crashAt (zero answered: none within the step), and when
// the gateway's lock view first named another owner (routed, polled every
// routePoll; zero: not seen).
type firstAsk struct {
	shard    sharding.ShardID
	crashAt  time.Time
	answered time.Time
	routed   time.Time
}

// routePoll is how often the gateway's view of the lost shards' owners is
// read while probing.
const routePoll = 2 * time.Millisecond

// probes are the probers of one crash step.
type probes struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	res    []firstAsk
	routed map[sharding.ShardID]time.Time // pollRoutes
}

// pollRoutes records when the gateway's view first names an owner of each
// shard of owned other than victim, until all do or ctx ends.
func (pr *probes) pollRoutes(ctx context.Context, gw *runner.Runner, owned []sharding.ShardID, victim string) {
	tick := time.NewTicker(routePoll)
	defer tick.Stop()
	left := len(owned)
	seen := make(map[sharding.ShardID]bool, len(owned))
	for left > 0 {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		now := time.Now()
		for _, id := range owned {
			if seen[id] {
				continue
			}
			if o, _ := gw.OwnerOf(id); o != "" && o != victim {
				seen[id], left = true, left-1
				pr.mu.Lock()
				pr.routed[id] = now
				pr.mu.Unlock()
			}
		}
	}
}

func (g *gatewayLoad) probe(owned []sharding.ShardID, victim string, crashAt time.Time) (int, error) {
	ctx, cancel := context.WithCancel(context.Background())
	pr := &probes{cancel: cancel, routed: map[sharding.ShardID]time.Time{}}
	pr.wg.Go(func() { pr.pollRoutes(ctx, g.gw, owned, victim) })
	for _, id := range owned {
		entity := g.probeIDs[id]
		pr.wg.Go(func() {
			for ctx.Err() == nil {
				actx, acancel := context.WithTimeout(ctx, probeTimeout)
				resp, err := runnerproc.Echo.Ask(actx, g.gw, entity, runnerproc.EchoReq{})
				acancel()
				if err == nil && resp.Runner != victim {
					pr.mu.Lock()
					pr.res = append(pr.res, firstAsk{shard: id, crashAt: crashAt, answered: time.Now()})
					pr.mu.Unlock()
					return
				}
				// An ask that failed at once (e.g. one sent to the victim
				// before the gateway saw it die) is retried after a
				// millisecond, not in a loop that would take a core from
				// what it measures.
				sleepUntil(ctx, time.Now().Add(time.Millisecond))
			}
			pr.mu.Lock()
			pr.res = append(pr.res, firstAsk{shard: id, crashAt: crashAt})
			pr.mu.Unlock()
		})
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probes = append(g.probes, pr)
	return len(g.probes) - 1, nil
}

func (g *gatewayLoad) probed(id int) ([]firstAsk, error) {
	g.mu.Lock()
	if id < 0 || id >= len(g.probes) || g.probes[id] == nil {
		g.mu.Unlock()
		return nil, fmt.Errorf("no probes %d", id)
	}
	pr := g.probes[id]
	g.probes[id] = nil
	g.mu.Unlock()
	return pr.finish(), nil
}

// finish waits for the probers (at most probeWait, then stops them) and
// returns their results.
func (pr *probes) finish() []firstAsk {
	done := make(chan struct{})
	go func() { pr.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(probeWait):
		pr.cancel()
		<-done
	}
	pr.cancel()
	for i := range pr.res {
		pr.res[i].routed = pr.routed[pr.res[i].shard]
	}
	return pr.res
}

// probeEntities returns an entity ID of every shard (of n), by shard.
func probeEntities(n int) []string {
	out, left := make([]string, n), n
	for i := 0; left > 0; i++ {
		e := fmt.Sprintf("probe-%d", i)
		if s := sharding.ShardOf(e, n); out[s] == "" {
			out[s], left = e, left-1
		}
	}
	return out
}
