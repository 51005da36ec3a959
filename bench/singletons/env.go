package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// env is one scenario's etcd, runners (in this process, each with its own
// etcd client) and child processes.
type env struct {
	p     params
	ns    string
	etcd  *testenv.Etcd
	dir   string
	cli   *clientv3.Client // the harness's own client
	nodes []*node
	kids  []*child
	life  *lifeLog
	evs   *eventLog
	// transport: every runner serves gRPC on loopback (needed as soon as
	// a child process is in the cluster); else none (one process).
	transport bool
	// the harness's watches
	bg     context.Context
	stopBg context.CancelFunc
	bgWG   sync.WaitGroup
}

type node struct {
	r   *runner.Runner
	cli *clientv3.Client
	sub *runner.Subscription
	fwd sync.WaitGroup
	ran chan error
	// stopped once closed or shut down
	stopped atomic.Bool
}

var namespaces atomic.Int64

func newEnv(ctx context.Context, p params) (*env, error) {
	m, dir, err := testenv.LaunchEtcdTemp(ctx, "shardhost-singletons-")
	if err != nil {
		return nil, err
	}
	cli, err := client(m.Endpoint())
	if err != nil {
		_ = m.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	e := &env{p: p, ns: fmt.Sprintf("single%d", namespaces.Add(1)), etcd: m, dir: dir, cli: cli, life: newLifeLog(), evs: &eventLog{}}
	e.bg, e.stopBg = context.WithCancel(context.Background())
	setSink(e.life)
	return e, nil
}

func client(endpoint string) (*clientv3.Client, error) {
	cfg := etcd.ClientConfig([]string{endpoint})
	cfg.Logger = zap.NewNop()
	cfg.MaxCallSendMsgSize = 64 << 20
	return clientv3.New(cfg)
}

func (e *env) close() {
	e.stopBg()
	e.bgWG.Wait()
	for _, k := range e.kids {
		k.kill()
	}
	for _, n := range e.nodes {
		n.close()
	}
	_ = e.cli.Close()
	_ = e.etcd.Close()
	_ = os.RemoveAll(e.dir)
}

// runnerConfig is the configuration every runner of the scenario uses
// (the children's too).
func (e *env) runnerConfig(id string) runner.Config {
	cfg := runner.Config{ID: id, NumShards: e.p.shards, LeaseTTL: e.p.ttl, RememberedStartRate: e.p.startRate}
	if e.transport {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	return cfg
}

// logger is the runners' logger: errors only, unless -v.
func logger(verbose bool) *slog.Logger {
	level := slog.LevelError
	if verbose {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

// newRunner returns runner id on store with the bench's singletons and
// remembered kind registered.
func newRunner(store storage.Store, cfg runner.Config, singletons int, verbose bool) (*runner.Runner, error) {
	cfg.Logger = logger(verbose)
	r, err := runner.New(store, cfg)
	if err != nil {
		return nil, err
	}
	if err := r.Register(twinKind, busyKind); err != nil {
		return nil, err
	}
	for i := range singletons {
		if err := r.RunSingleton(singleName(i), singletonBody); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// start runs runner id in this process.
func (e *env) start(id string) (*node, error) {
	cli, err := client(e.etcd.Endpoint())
	if err != nil {
		return nil, err
	}
	store, err := etcd.New(cli, e.ns, etcd.Config{})
	if err != nil {
		cli.Close()
		return nil, err
	}
	r, err := newRunner(store, e.runnerConfig(id), e.p.singletons, e.p.verbose)
	if err != nil {
		cli.Close()
		return nil, err
	}
	n := &node{r: r, cli: cli, sub: r.Subscribe(), ran: make(chan error, 1)}
	n.fwd.Go(func() {
		for ev := range n.sub.Events() {
			e.evs.add(ev)
		}
	})
	go func() { n.ran <- r.Run(context.Background()) }()
	e.nodes = append(e.nodes, n)
	return n, nil
}

// close stops n abruptly (Close: nothing released, the lease runs out).
func (n *node) close() {
	if n.stopped.Swap(true) {
		return
	}
	n.r.Close()
	<-n.ran
	n.sub.Close()
	n.fwd.Wait()
	_ = n.cli.Close()
}

// shutdown stops n gracefully (its shards are handed off).
func (n *node) shutdown() error {
	if n.stopped.Swap(true) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := n.r.Shutdown(ctx)
	<-n.ran
	n.sub.Close()
	n.fwd.Wait()
	_ = n.cli.Close()
	return err
}

// live returns the nodes whose runner runs.
func (e *env) live() []*node {
	var out []*node
	for _, n := range e.nodes {
		if !n.stopped.Load() {
			out = append(out, n)
		}
	}
	return out
}

// members returns the IDs of the live runners, children included.
func (e *env) members() []string {
	var out []string
	for _, n := range e.live() {
		out = append(out, n.r.ID())
	}
	for _, k := range e.kids {
		if !k.dead() {
			out = append(out, k.id)
		}
	}
	slices.Sort(out)
	return out
}

// settled reports whether the live in-process runners see every live
// runner (children too) as a member, agree on the assignment, and every
// shard's lock is held by its assignee.
func (e *env) settled() bool { return e.unsettled() == "" }

// unsettled says why the cluster is not settled ("": it is).
func (e *env) unsettled() string {
	live := e.live()
	if len(live) == 0 {
		return "no live runner"
	}
	want := e.members()
	var a sharding.Assignment
	for i, n := range live {
		var got []string
		for _, m := range n.r.Members() {
			got = append(got, m.ID)
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			return fmt.Sprintf("%s sees members %v, want %v", n.r.ID(), got, want)
		}
		ai := n.r.Assignment()
		if i > 0 && !slices.Equal(ai, a) {
			return fmt.Sprintf("%s's assignment %v differs from %s's %v", n.r.ID(), ai, live[0].r.ID(), a)
		}
		a = ai
	}
	if len(a) != e.p.shards {
		return fmt.Sprintf("assignment of %d shards, want %d", len(a), e.p.shards)
	}
	// The members are seen before the assignment is computed again (a
	// debounce later): an assignment without a live runner is an old one.
	if e.p.shards >= len(want) {
		for _, m := range want {
			if !slices.Contains(a, m) {
				return fmt.Sprintf("assignment %v without member %s", a, m)
			}
		}
	}
	// Every shard is locked by its assignee, which knows it owns it (the
	// other runners route by assignment and hints: no view of its lock).
	locks := e.locks()
	byID := map[string]*node{}
	for _, n := range live {
		byID[n.r.ID()] = n
	}
	for id := range e.p.shards {
		l, ok := locks[sharding.ShardID(id)]
		if !ok || l.Owner.RunnerID != a[id] {
			return fmt.Sprintf("shard %d locked by %q, assigned to %s", id, l.Owner.RunnerID, a[id])
		}
		if n := byID[a[id]]; n != nil {
			if owner, epoch := n.r.OwnerOf(sharding.ShardID(id)); owner != a[id] || epoch != l.Epoch {
				return fmt.Sprintf("shard %d: its owner %s sees owner %q at epoch %d, etcd %d", id, a[id], owner, epoch, l.Epoch)
			}
		}
	}
	return ""
}

// locks returns the shards' locks as etcd has them: a runner's own view
// holds the locks of its shards only (elsewhere it routes by assignment
// and hints), so the harness reads the owners where they are written.
// An unreadable or corrupt lock reads as none (not settled yet).
func (e *env) locks() map[sharding.ShardID]storage.Lock {
	ctx, cancel := context.WithTimeout(e.bg, 5*time.Second)
	defer cancel()
	prefix := "/" + e.ns + "/" + storage.Key(storage.KeyspaceShards, "")
	resp, err := e.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil
	}
	out := make(map[sharding.ShardID]storage.Lock, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		l, err := storage.DecodeLock(storage.KeyValue{
			Key: strings.TrimPrefix(string(kv.Key), prefix), Value: kv.Value,
			Lease: storage.LeaseID(kv.Lease), ModRevision: storage.Revision(kv.ModRevision),
		})
		if err == nil {
			out[l.Shard] = l
		}
	}
	return out
}

// runningWhereOwned reports whether every singleton runs exactly once, on
// its shard's owner at the current epoch, and every entity in ids was last
// activated by its shard's owner at the current epoch.
func (e *env) runningWhereOwned(ids []string) bool {
	locks := e.locks()
	owner := func(shard sharding.ShardID) (string, storage.Epoch) {
		l := locks[shard]
		return l.Owner.RunnerID, l.Epoch
	}
	runs, _ := e.life.snapshot()
	for i := range e.p.singletons {
		name := singleName(i)
		owner, epoch := owner(runner.SingletonShard(name, e.p.shards))
		open := 0
		for _, r := range runs {
			if r.name == name && r.end.IsZero() {
				open++
				if r.runner != owner || r.epoch != epoch {
					return false
				}
			}
		}
		if open != 1 {
			return false
		}
	}
	e.life.mu.Lock()
	defer e.life.mu.Unlock()
	for _, id := range ids {
		owner, epoch := owner(sharding.ShardOf(id, e.p.shards))
		a, ok := e.life.last[id]
		if !ok || a.Runner != owner || storage.Epoch(a.Epoch) != epoch {
			return false
		}
	}
	return true
}

// waitSettled waits until settled and, for every singleton and every
// entity in ids, running where owned.
func (e *env) waitSettled(ctx context.Context, ids []string, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	for !e.settled() || !e.runningWhereOwned(ids) {
		if time.Since(start) > limit {
			return time.Since(start), fmt.Errorf("not settled after %v (%s)", limit, cmp.Or(e.unsettled(), "cluster settled; an entity or singleton not running where owned"))
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return time.Since(start), nil
}

// twinIDs returns n entity IDs; in shard (if >= 0) only.
func twinIDs(n, shards int, shard int) []string {
	out := make([]string, 0, n)
	for i := 0; len(out) < n; i++ {
		id := fmt.Sprint("t", i)
		if shard < 0 || int(sharding.ShardOf(id, shards)) == shard {
			out = append(out, id)
		}
	}
	return out
}

// remember writes the remembered markers of ids straight into etcd (bulk
// setup: each marker as a runner writes it, epoch 1), in transactions of
// 128 puts, 8 at a time.
func (e *env) remember(ctx context.Context, ids []string) error {
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for chunk := range slices.Chunk(ids, storage.MaxTxnOps) {
		ops := make([]clientv3.Op, len(chunk))
		for i, id := range chunk {
			shard := sharding.ShardOf(id, e.p.shards)
			ref := storage.EntityRef{Kind: twinKind.Name(), ID: id}
			v, err := storage.EncodeRemembered(storage.RememberedEntity{Shard: shard, Entity: ref, Epoch: 1})
			if err != nil {
				return err
			}
			ops[i] = clientv3.OpPut("/"+e.ns+"/"+storage.RememberedKey(shard, ref), string(v))
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := e.cli.Txn(cctx).Then(ops...).Commit()
			cancel()
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// revision returns etcd's current revision.
func (e *env) revision(ctx context.Context) (int64, error) {
	resp, err := e.cli.Get(ctx, "/"+e.ns+"/cluster", clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// count returns the number of keys under the namespace's prefix.
func (e *env) count(ctx context.Context, prefix string) (int64, error) {
	resp, err := e.cli.Get(ctx, "/"+e.ns+"/"+prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Count, nil
}

// keyWatch records the events of a prefix as the harness's watch
// delivers them.
type keyWatch struct {
	mu  sync.Mutex
	evs []keyEvent
}

type keyEvent struct {
	key string
	rev int64
	del bool
	at  time.Time // when the watch delivered it
}

// watch watches the keys under the namespace's prefix from revision
// from+1 until the env closes.
func (e *env) watch(prefix string, from int64) *keyWatch {
	w := &keyWatch{}
	e.bgWG.Go(func() {
		last := from
		for e.bg.Err() == nil {
			for wr := range e.cli.Watch(clientv3.WithRequireLeader(e.bg), "/"+e.ns+"/"+prefix, clientv3.WithPrefix(), clientv3.WithRev(last+1)) {
				now := time.Now()
				w.mu.Lock()
				for _, ev := range wr.Events {
					last = max(last, ev.Kv.ModRevision)
					w.evs = append(w.evs, keyEvent{key: string(ev.Kv.Key), rev: ev.Kv.ModRevision, del: ev.Type == clientv3.EventTypeDelete, at: now})
				}
				w.mu.Unlock()
			}
			select { // the watch failed: watch again
			case <-e.bg.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
	return w
}

// between returns the events of revisions in (from, to], and how many
// distinct revisions (writes) they came in.
func (w *keyWatch) between(from, to int64) (events, writes int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	revs := map[int64]bool{}
	for _, ev := range w.evs {
		if ev.rev > from && ev.rev <= to {
			events++
			revs[ev.rev] = true
		}
	}
	return events, len(revs)
}

// deletedAt returns when the watch delivered the first DELETE of key
// after t (zero if none).
func (w *keyWatch) deletedAt(key string, t time.Time) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, ev := range w.evs {
		if ev.del && ev.key == key && !ev.at.Before(t) {
			return ev.at
		}
	}
	return time.Time{}
}

// byKeyspace returns, for the revisions in (from, to], how many touched
// each keyspace (the first segment of the key under the namespace).
func (w *keyWatch) byKeyspace(ns string, from, to int64) map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := map[string]map[int64]bool{}
	for _, ev := range w.evs {
		if ev.rev <= from || ev.rev > to {
			continue
		}
		ks, _, _ := strings.Cut(strings.TrimPrefix(ev.key, "/"+ns+"/"), "/")
		if seen[ks] == nil {
			seen[ks] = map[int64]bool{}
		}
		seen[ks][ev.rev] = true
	}
	out := map[string]int{}
	for ks, revs := range seen {
		out[ks] = len(revs)
	}
	return out
}
