package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/bench/internal/runnerproc"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/etcd"
)

// TestCrashFailover measures crash failover the way it happens in
// production: three runners, each a process of its own with the default
// configuration (1024 shards, lease TTL 5 s), on a 3-member etcd cluster;
// a gateway in the test process asks entities of every shard; one runner
// process gets SIGKILL. It measures, per run, from the SIGKILL to every
// shard of the dead runner answering again, and the steps in between:
//
//	crash -> server deleted the dead runner's keys (lease expiry: the TTL
//	         left since its last renewal + etcd's expiry sweep)
//	      -> DELETE delivered to the survivors' watches
//	      -> each lock acquired by a survivor
//	      -> first ask of each shard served by its new owner
//
// It checks by etcd revision that every takeover lock was written after the
// server deleted the dead runner's keys, and that every shard answers again.
// One run in `make test`; the figure in BENCHMARKS.md is
//
//	SHARDHOST_FAILOVER_RUNS=10 go test -count=1 -run '^TestCrashFailover$' -v ./bench/
//
// SHARDHOST_FAILOVER_DEBOUNCE=<duration> sets the runners' RebalanceDebounce
// (default 100 ms), to show what the debounce costs.
func TestCrashFailover(t *testing.T) {
	runs := 1
	if s := os.Getenv("SHARDHOST_FAILOVER_RUNS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			t.Fatalf("SHARDHOST_FAILOVER_RUNS=%q: want a positive integer", s)
		}
		runs = n
	}
	var debounce time.Duration
	if s := os.Getenv("SHARDHOST_FAILOVER_DEBOUNCE"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("SHARDHOST_FAILOVER_DEBOUNCE=%q: %v", s, err)
		}
		debounce = d
	}
	cl := testenv.StartEtcdCluster(t, 3)
	var results []failover
	for run := range runs {
		f := crashOnce(t, cl, run, debounce)
		t.Logf("RESULT run=%d %s", run, f)
		results = append(results, f)
	}
	summarize(t, results)
}

// failover is one run's measurement.
type failover struct {
	shards       int           // shards of the crashed runner
	ttlLeft      time.Duration // crash -> lease deadline known to the crashed runner (last renewal + TTL)
	expiry       time.Duration // crash -> the server deleted its keys (first watcher to receive the DELETE)
	sweep        time.Duration // lease deadline -> keys deleted (etcd's expiry sweep and revoke)
	watch        time.Duration // keys deleted -> DELETE delivered in the last survivor
	acquire      []time.Duration
	firstAsk     []time.Duration // lock acquired -> first ask served, per shard
	allAcquired  time.Duration   // crash -> last lock acquired
	allAnswering time.Duration   // crash -> every shard answered
	failedAsks   int64           // background asks that failed (in flight to the crashed runner)
}

func (f failover) String() string {
	return fmt.Sprintf("shards=%d crash->all_answering=%v crash->expiry=%v (ttl_left=%v sweep=%v) watch=%v acquire_after_delete p50=%v p99=%v max=%v first_ask_after_acquire p50=%v max=%v crash->all_acquired=%v failed_background_asks=%d",
		f.shards, ms(f.allAnswering), ms(f.expiry), ms(f.ttlLeft), ms(f.sweep), ms(f.watch),
		ms(pct(f.acquire, 50)), ms(pct(f.acquire, 99)), ms(pct(f.acquire, 100)),
		ms(pct(f.firstAsk, 50)), ms(pct(f.firstAsk, 100)), ms(f.allAcquired), f.failedAsks)
}

func ms(d time.Duration) time.Duration { return d.Round(100 * time.Microsecond) }

// pct returns the p-th percentile (nearest rank) of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (p*len(s) + 99) / 100
	return s[min(max(i-1, 0), len(s)-1)]
}

func summarize(t *testing.T, rs []failover) {
	pick := func(f func(failover) time.Duration) []time.Duration {
		out := make([]time.Duration, len(rs))
		for i, r := range rs {
			out[i] = f(r)
		}
		return out
	}
	var acquire, firstAsk []time.Duration
	for _, r := range rs {
		acquire = append(acquire, r.acquire...)
		firstAsk = append(firstAsk, r.firstAsk...)
	}
	line := func(name string, ds []time.Duration) {
		t.Logf("SUMMARY %-40s median %-9v min %-9v max %v", name, ms(pct(ds, 50)), ms(pct(ds, 0)), ms(pct(ds, 100)))
	}
	t.Logf("SUMMARY %d runs, default configuration (LeaseTTL %v), 1024 shards on 3 runner processes, 3-member etcd", len(rs), runner.DefaultLeaseTTL)
	line("crash -> every shard answering", pick(func(f failover) time.Duration { return f.allAnswering }))
	line("crash -> keys deleted on the server", pick(func(f failover) time.Duration { return f.expiry }))
	line("  crash -> lease deadline (TTL left)", pick(func(f failover) time.Duration { return f.ttlLeft }))
	line("  lease deadline -> keys deleted (sweep)", pick(func(f failover) time.Duration { return f.sweep }))
	line("keys deleted -> watch event (last survivor)", pick(func(f failover) time.Duration { return f.watch }))
	line("crash -> every lock acquired", pick(func(f failover) time.Duration { return f.allAcquired }))
	t.Logf("SUMMARY %-40s p50 %v p99 %v max %v (%d shards)", "keys deleted -> lock acquired", ms(pct(acquire, 50)), ms(pct(acquire, 99)), ms(pct(acquire, 100)), len(acquire))
	t.Logf("SUMMARY %-40s p50 %v p99 %v max %v", "lock acquired -> first ask served", ms(pct(firstAsk, 50)), ms(pct(firstAsk, 99)), ms(pct(firstAsk, 100)))
}

// ownedBy returns the shards p owns by its events, at their epochs.
func ownedBy(p *runnerproc.Proc) map[int]int64 {
	m := map[int]int64{}
	for _, ev := range p.Events() {
		switch ev.Kind {
		case runnerproc.KindAcquired:
			m[ev.Shard] = ev.Epoch
		case runnerproc.KindReleased, runnerproc.KindLost, runnerproc.KindDetached:
			if ev.Kind == runnerproc.KindDetached {
				clear(m)
			}
			delete(m, ev.Shard)
		}
	}
	return m
}

// entityOf returns an entity ID of shard s (of n).
func entityOf(s, n int) string {
	for i := 0; ; i++ {
		if id := fmt.Sprintf("e%d", i); int(sharding.ShardOf(id, n)) == s {
			return id
		}
	}
}

func crashOnce(t *testing.T, cl *testenv.EtcdCluster, run int, debounce time.Duration) failover {
	t.Helper()
	n := runner.DefaultNumShards
	ns := fmt.Sprintf("failover-%d", run)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// The observer: a direct client, watching the namespace's deletions.
	obs := cl.Client(t)
	type deletion struct {
		at  time.Time
		rev int64
	}
	var (
		delMu   sync.Mutex
		deleted = map[string]deletion{} // runner ID -> its key's deletion
	)
	wctx, wcancel := context.WithCancel(ctx)
	wdone := make(chan struct{})
	go func() {
		defer close(wdone)
		prefix := "/" + ns + "/runners/"
		for wr := range obs.Watch(wctx, prefix, clientv3.WithPrefix(), clientv3.WithFilterPut()) {
			now := time.Now()
			delMu.Lock()
			for _, ev := range wr.Events {
				deleted[strings.TrimPrefix(string(ev.Kv.Key), prefix)] = deletion{now, ev.Kv.ModRevision}
			}
			delMu.Unlock()
		}
	}()
	defer func() { wcancel(); <-wdone }()

	var procs []*runnerproc.Proc
	for i := range 3 {
		p, err := runnerproc.Start(ctx, runnerproc.Spec{
			Endpoints: cl.Endpoints(), Namespace: ns, WatchDeletes: true,
			Config: runnerproc.Config{ID: fmt.Sprintf("r%d", i), RebalanceDebounce: debounce},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Kill() })
		procs = append(procs, p)
	}
	// The gateway: client-only, in this process.
	gs, err := etcd.New(cl.Client(t), ns, etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := runner.New(gs, runner.Config{ID: "gw", ClientOnly: true, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := gw.Register(runnerproc.Kind); err != nil {
		t.Fatal(err)
	}
	gwDone := make(chan struct{})
	go func() { defer close(gwDone); _ = gw.Run(context.Background()) }()
	defer func() { gw.Close(); <-gwDone }()

	// Exact, balanced partition (the default strategy gives each runner
	// n/3 or n/3+1 shards, so no handoff is still running): every shard
	// owned once, by the processes' events and by the gateway's view of
	// the locks.
	ids := make([]string, n)
	for s := range n {
		ids[s] = entityOf(s, n)
	}
	started := time.Now()
	for {
		total, union, balanced := 0, map[int]bool{}, true
		for _, p := range procs {
			o := ownedBy(p)
			total += len(o)
			balanced = balanced && (len(o) == n/3 || len(o) == n/3+1)
			for s := range o {
				union[s] = true
			}
		}
		routed := 0
		for s := range n {
			if o, _ := gw.OwnerOf(sharding.ShardID(s)); o != "" {
				routed++
			}
		}
		if total == n && len(union) == n && routed == n && balanced {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no exact, balanced partition: %d owned, %d distinct, %d routed, balanced %v", total, len(union), routed, balanced)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Background load: 4 callers, each about 250 asks/s over all shards.
	var failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			tick := time.NewTicker(4 * time.Millisecond)
			defer tick.Stop()
			for i := g; ; i += 4 {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				actx, acancel := context.WithTimeout(ctx, 10*time.Second)
				if _, err := runnerproc.Echo.Ask(actx, gw, ids[(i*7)%n], runnerproc.EchoReq{}); err != nil {
					failed.Add(1)
				}
				acancel()
			}
		})
	}
	stopLoad := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopLoad()
	// Steady state, then a crash at a random point of the renewal cycle
	// (renewals every TTL/6 at the default config): the time from the
	// crash to the lease's expiry depends on it.
	time.Sleep(time.Second + rand.N(runner.DefaultLeaseTTL/6))
	t.Logf("run %d: exact partition %v after the runners started", run, time.Since(started).Round(time.Millisecond))

	victim := procs[run%3]
	survivors := slices.DeleteFunc(slices.Clone(procs), func(p *runnerproc.Proc) bool { return p == victim })
	lost := ownedBy(victim)
	failed0 := failed.Load()
	crashed := time.Now()
	if err := victim.Kill(); err != nil {
		t.Fatal(err)
	}
	// Probes: one per shard of the victim, until a survivor answers.
	answered := make(map[int]time.Time, len(lost))
	var amu sync.Mutex
	var pwg sync.WaitGroup
	for s := range lost {
		pwg.Go(func() {
			for ctx.Err() == nil {
				actx, acancel := context.WithTimeout(ctx, 10*time.Second)
				resp, err := runnerproc.Echo.Ask(actx, gw, ids[s], runnerproc.EchoReq{})
				acancel()
				if err == nil && resp.Runner != victim.ID() {
					amu.Lock()
					answered[s] = time.Now()
					amu.Unlock()
					return
				}
			}
		})
	}
	pwg.Wait()
	if len(answered) != len(lost) {
		t.Fatalf("%d of %d shards of the crashed runner answered again: %v", len(answered), len(lost), ctx.Err())
	}
	f := failover{shards: len(lost), failedAsks: failed.Load() - failed0}
	for _, at := range answered {
		f.allAnswering = max(f.allAnswering, at.Sub(crashed))
	}

	// The victim's last lease deadline before the crash.
	var deadline time.Time
	for _, ev := range victim.Events() {
		if ev.Kind == runnerproc.KindDeadline && ev.Time.Before(crashed) {
			deadline = ev.Deadline
		}
	}
	delMu.Lock()
	del, ok := deleted[victim.ID()]
	delMu.Unlock()
	if !ok {
		t.Fatalf("the observer never saw %s's runner key deleted", victim.ID())
	}
	// The deletion's time is when the first watcher (the observer or a
	// survivor, whichever process the machine scheduled first) received it;
	// the watch step is the spread to the last survivor.
	var watched []time.Time
	for _, p := range survivors {
		ev, err := p.WaitFor(ctx, func(ev runnerproc.Event) bool {
			return ev.Kind == runnerproc.KindWatchDelete && ev.Key == "runners/" && slices.Contains(strings.Split(ev.Detail, ","), victim.ID())
		})
		if err != nil {
			t.Fatalf("%s's watch did not deliver %s's deletion: %v", p.ID(), victim.ID(), err)
		}
		if ev.Revision != del.rev {
			t.Fatalf("%s saw %s's deletion at revision %d, the observer at %d", p.ID(), victim.ID(), ev.Revision, del.rev)
		}
		watched = append(watched, ev.Time)
		if ev.Time.Before(del.at) {
			del.at = ev.Time
		}
	}
	for _, at := range watched {
		f.watch = max(f.watch, at.Sub(del.at))
	}
	f.ttlLeft, f.expiry, f.sweep = deadline.Sub(crashed), del.at.Sub(crashed), del.at.Sub(deadline)

	// The takeover of each lost shard. A survivor reports its events
	// asynchronously (a line on its output after the event), so its answer
	// to a probe can arrive before the line of the acquisition preceding
	// it: wait (bounded) for every acquisition to be reported.
	var acquiredAt map[int]time.Time
	var early []string // acquisitions not after the deletion
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		acquiredAt, early = map[int]time.Time{}, nil
		for _, p := range survivors {
			for _, ev := range p.Events() {
				if _, was := lost[ev.Shard]; ev.Kind != runnerproc.KindAcquired || !was || ev.Time.Before(crashed) {
					continue
				}
				if ev.Epoch <= del.rev {
					early = append(early, fmt.Sprintf("%s acquired shard %d at revision %d, not after %s's keys were deleted at revision %d", p.ID(), ev.Shard, ev.Epoch, victim.ID(), del.rev))
				}
				if at, dup := acquiredAt[ev.Shard]; !dup || ev.Time.Before(at) {
					acquiredAt[ev.Shard] = ev.Time
				}
			}
		}
		if len(acquiredAt) == len(lost) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
	}
	for _, e := range early {
		t.Error(e)
	}
	if len(acquiredAt) != len(lost) {
		t.Fatalf("%d of %d shards of the crashed runner acquired by survivors", len(acquiredAt), len(lost))
	}
	for s, at := range acquiredAt {
		f.acquire = append(f.acquire, at.Sub(del.at))
		f.firstAsk = append(f.firstAsk, answered[s].Sub(at))
		f.allAcquired = max(f.allAcquired, at.Sub(crashed))
	}
	stopLoad() // before the survivors go: asks to them would wait their timeout
	for _, p := range survivors {
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
