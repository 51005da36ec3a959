package runner_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// The planned-move tests' fixtures: an account entity with hook traces,
// a cluster of etcd runners, a load of asks, and the checks of phases,
// counters and cutover windows.

// acct is a counter that survives planned moves: it checkpoints in Release
// and restores in Activate; Warm pre-loads the checkpoint on the new owner.
type acct struct {
	id     string
	n      int64
	warmed bool
	hooks  *hookTrace
}

type hookTrace struct {
	mu     sync.Mutex
	events []string // "<runner> <hook> <shard>"
	warms  atomic.Int64
}

func (h *hookTrace) add(runner, hook string, shard sharding.ShardID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, fmt.Sprintf("%s %s %d", runner, hook, shard))
}

func (h *hookTrace) list() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.events)
}

type acctReq struct{ By int64 }

type acctResp struct {
	N      int64
	Runner string
}

func (a *acct) Inc(ctx context.Context, r acctReq) (acctResp, error) {
	a.n += r.By
	info, _ := runner.ShardInfoFrom(ctx)
	return acctResp{N: a.n, Runner: info.Runner}, nil
}

func loadCount(b []byte) int64 { return int64(binary.BigEndian.Uint64(b)) }

func (a *acct) Warm(ctx context.Context, info entity.WarmInfo) error {
	a.hooks.warms.Add(1)
	a.warmed = true
	return nil
}

func (a *acct) Activate(ctx context.Context, info entity.ActivateInfo) error {
	b, ok, err := info.Restore(ctx)
	if err != nil {
		return err
	}
	if ok {
		a.n = loadCount(b)
	}
	return nil
}

func (a *acct) Release(ctx context.Context, info entity.ReleaseInfo) error {
	return info.Checkpoint(ctx, binary.BigEndian.AppendUint64(nil, uint64(a.n)))
}

// handoffEnv is a real-etcd cluster of hosting runners plus a gateway.
type handoffEnv struct {
	t      *testing.T
	c      *cluster
	kind   *entity.Kind[acct]
	inc    *entity.MethodRef[acct, acctReq, acctResp]
	hooks  *hookTrace
	gw     *etcdRunner
	shards int
	ttl    time.Duration
	// hook behaviour knobs (per runner ID)
	blockWarm    sync.Map // runner ID -> chan struct{} (WarmShard blocks until closed or ctx)
	blockRelease sync.Map // runner ID -> chan struct{} (ReleaseShard blocks)
}

func newHandoffEnv(t *testing.T, shards int, ttl time.Duration) *handoffEnv {
	e := &handoffEnv{t: t, c: startEtcdCluster(t), hooks: &hookTrace{}, shards: shards, ttl: ttl}
	e.kind = entity.NewKind("acct", func(id string) *acct { return &acct{id: id, hooks: e.hooks} })
	e.inc = entity.Method(e.kind, "inc", (*acct).Inc)
	e.gw = e.c.start(runner.Config{ID: "gateway", NumShards: shards, ClientOnly: true})
	if err := e.gw.Register(e.kind); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *handoffEnv) start(id string) *etcdRunner {
	cfg := runner.Config{
		ID: id, NumShards: e.shards, ListenAddr: "127.0.0.1:0", LeaseTTL: e.ttl,
		WarmShard: func(ctx context.Context, s sharding.ShardID, from string) error {
			e.hooks.add(id, "WarmShard", s)
			if ch, ok := e.blockWarm.Load(id); ok {
				select {
				case <-ch.(chan struct{}):
				case <-ctx.Done():
				}
			}
			return nil
		},
		ReleaseShard: func(ctx context.Context, s sharding.ShardID, to string) error {
			e.hooks.add(id, "ReleaseShard", s)
			if ch, ok := e.blockRelease.Load(id); ok {
				select {
				case <-ch.(chan struct{}):
				case <-ctx.Done():
				}
			}
			return nil
		},
	}
	r := e.c.start(cfg)
	if err := r.Register(e.kind); err != nil {
		e.t.Fatal(err)
	}
	return r
}

// load drives steady asks to n entities from the gateway and records the
// acknowledged increments and latencies.
type load struct {
	acked   []atomic.Int64
	failed  atomic.Int64
	errs    []error
	mu      sync.Mutex
	lat     []time.Duration
	latAt   []time.Time
	stop    chan struct{}
	wg      sync.WaitGroup
	entries int
}

func (e *handoffEnv) drive(entities, callers int) *load {
	l := &load{acked: make([]atomic.Int64, entities), stop: make(chan struct{}), entries: entities}
	for g := range callers {
		l.wg.Go(func() {
			for i := g; ; i += callers {
				select {
				case <-l.stop:
					return
				default:
				}
				n := i % entities
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				t0 := time.Now()
				_, err := e.inc.Ask(ctx, e.gw, fmt.Sprintf("acct-%d", n), acctReq{By: 1})
				d := time.Since(t0)
				cancel()
				if err != nil {
					l.failed.Add(1)
					l.mu.Lock()
					l.errs = append(l.errs, err)
					l.mu.Unlock()
					continue
				}
				l.acked[n].Add(1)
				l.mu.Lock()
				l.lat = append(l.lat, d)
				l.latAt = append(l.latAt, t0)
				l.mu.Unlock()
			}
		})
	}
	return l
}

func (l *load) finish(t *testing.T) {
	t.Helper()
	close(l.stop)
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("asks hanging")
	}
}

// latencies returns p50/p99/max of the asks started in [from, to).
func (l *load) latencies(from, to time.Time) (p50, p99, mx time.Duration, n int) {
	l.mu.Lock()
	var ds []time.Duration
	for i, at := range l.latAt {
		if !at.Before(from) && at.Before(to) {
			ds = append(ds, l.lat[i])
		}
	}
	l.mu.Unlock()
	if len(ds) == 0 {
		return 0, 0, 0, 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1], len(ds)
}

// checkCounters asks every entity once more (By 0) and compares with the
// acknowledged increments.
func (e *handoffEnv) checkCounters(l *load) {
	e.t.Helper()
	bad := 0
	for n := range l.entries {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		got, err := e.inc.Ask(ctx, e.gw, fmt.Sprintf("acct-%d", n), acctReq{})
		cancel()
		if err != nil || got.N != l.acked[n].Load() {
			if bad++; bad <= 5 {
				e.t.Errorf("acct-%d = %d (%v), acknowledged %d", n, got.N, err, l.acked[n].Load())
			}
		}
	}
	if bad > 0 {
		e.t.Errorf("%d of %d counters differ from their acknowledged increments", bad, l.entries)
	}
}

// movesOf returns, per shard, the ownership changes between live runners
// after since, as "from->to".
// waitAcquiredRecorded waits until the recorder holds, for every shard
// each of rs owns, its ShardAcquired at the epoch owned: events reach the
// recorder through a subscription, after the ownership they announce.
func (c *cluster) waitAcquiredRecorded(rs ...*etcdRunner) {
	c.t.Helper()
	type key struct {
		runner string
		shard  sharding.ShardID
		epoch  storage.Epoch
	}
	waitFor(c.t, 10*time.Second, "every ownership's ShardAcquired recorded", func() bool {
		seen := map[key]bool{}
		for _, ev := range c.rec.all() {
			if x, ok := ev.(runner.ShardAcquired); ok {
				seen[key{x.Runner, x.Shard, x.Epoch}] = true
			}
		}
		for _, r := range rs {
			for id, epoch := range r.Owned() {
				if !seen[key{r.ID(), id, epoch}] {
					return false
				}
			}
		}
		return true
	})
}

func movesOf(evs []runner.Event, since time.Time) map[sharding.ShardID][]string {
	owner := map[sharding.ShardID]string{}
	released := map[sharding.ShardID]string{}
	out := map[sharding.ShardID][]string{}
	for _, ev := range evs {
		switch x := ev.(type) {
		case runner.ShardAcquired:
			if from := released[x.Shard]; from != "" && from != x.Runner && !x.Time.Before(since) {
				out[x.Shard] = append(out[x.Shard], from+"->"+x.Runner)
			}
			owner[x.Shard], released[x.Shard] = x.Runner, ""
		case runner.ShardReleased:
			if owner[x.Shard] == x.Runner {
				owner[x.Shard], released[x.Shard] = "", x.Runner
			}
		case runner.ShardLost:
			if owner[x.Shard] == x.Runner {
				owner[x.Shard], released[x.Shard] = "", ""
			}
		}
	}
	return out
}

// checkPhases verifies that every planned move went warming -> ready ->
// drained -> cutover, in that order.
func checkPhases(t *testing.T, evs []runner.Event, moves map[sharding.ShardID][]string) {
	t.Helper()
	type key struct {
		shard    sharding.ShardID
		from, to string
	}
	seq := map[key][]string{}
	for _, ev := range evs {
		if p, ok := ev.(runner.HandoffPhase); ok && p.Phase != runner.PhaseAborted {
			k := key{p.Shard, p.From, p.To}
			seq[k] = append(seq[k], p.Phase)
		}
	}
	bad := 0
	for shard, ms := range moves {
		for _, m := range ms {
			var from, to string
			fmt.Sscanf(stringsReplace(m), "%s %s", &from, &to)
			got := seq[key{shard, from, to}]
			want := []string{runner.PhaseWarming, runner.PhaseReady, runner.PhaseDrained, runner.PhaseCutover}
			if !isSubsequence(want, got) {
				if bad++; bad <= 5 {
					t.Errorf("shard %d moved %s without the handoff phases: %v", shard, m, got)
				}
			}
		}
	}
}

func stringsReplace(m string) string {
	for i := 0; i+1 < len(m); i++ {
		if m[i] == '-' && m[i+1] == '>' {
			return m[:i] + " " + m[i+2:]
		}
	}
	return m
}

func isSubsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// cutoverWindows returns, for every ownership change after since, the
// time no runner owned the shard: from the old owner's ShardReleased to the
// new owner's ShardAcquired.
func cutoverWindows(evs []runner.Event, since, until time.Time) []time.Duration {
	released := map[sharding.ShardID]time.Time{}
	var out []time.Duration
	for _, ev := range evs {
		switch x := ev.(type) {
		case runner.ShardReleased:
			if !x.Time.Before(since) && x.Time.Before(until) {
				released[x.Shard] = x.Time
			}
		case runner.ShardAcquired:
			if at, ok := released[x.Shard]; ok {
				out = append(out, x.Time.Sub(at))
				delete(released, x.Shard)
			}
		}
	}
	slices.Sort(out)
	return out
}

func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	return fmt.Sprintf("p50 %v p99 %v max %v (n=%d)", ds[len(ds)/2], ds[len(ds)*99/100], ds[len(ds)-1], len(ds))
}

func countMoves(moves map[sharding.ShardID][]string) int {
	n := 0
	for _, ms := range moves {
		n += len(ms)
	}
	return n
}
