package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// env is one scenario's etcd and runners.
type env struct {
	p     params
	ns    string
	etcd  *testenv.Etcd
	dir   string
	cli   *clientv3.Client // the harness's own client
	nodes []*node
	rec   *tickLog
}

type node struct {
	r   *runner.Runner
	cli *clientv3.Client
	ran chan error
}

var namespaces atomic.Int64

func newEnv(ctx context.Context, p params) (*env, error) {
	m, dir, err := testenv.LaunchEtcdTemp(ctx, "shardhost-reminders-")
	if err != nil {
		return nil, err
	}
	cli, err := client(m.Endpoint())
	if err != nil {
		_ = m.Close()
		os.RemoveAll(dir)
		return nil, err
	}
	return &env{p: p, ns: fmt.Sprintf("rem%d", namespaces.Add(1)), etcd: m, dir: dir, cli: cli, rec: newTickLog()}, nil
}

func client(endpoint string) (*clientv3.Client, error) {
	cfg := etcd.ClientConfig([]string{endpoint})
	cfg.Logger = zap.NewNop()
	cfg.MaxCallSendMsgSize = 64 << 20
	return clientv3.New(cfg)
}

func (e *env) close() {
	for _, n := range e.nodes {
		n.close()
	}
	_ = e.cli.Close()
	_ = e.etcd.Close()
	_ = os.RemoveAll(e.dir)
}

// start runs a hosting runner id (in this process, no transport: the
// runners of one process reach each other directly).
func (e *env) start(id string, cfg runner.Config) (*node, error) {
	cli, err := client(e.etcd.Endpoint())
	if err != nil {
		return nil, err
	}
	store, err := etcd.New(cli, e.ns, etcd.Config{})
	if err != nil {
		cli.Close()
		return nil, err
	}
	cfg.ID, cfg.NumShards = id, e.p.shards
	if cfg.Logger == nil {
		level := slog.LevelError
		if e.p.verbose {
			level = slog.LevelInfo
		}
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	}
	r, err := runner.New(store, cfg)
	if err == nil {
		err = r.Register(benchKind)
	}
	if err != nil {
		cli.Close()
		return nil, err
	}
	n := &node{r: r, cli: cli, ran: make(chan error, 1)}
	go func() { n.ran <- r.Run(context.Background()) }()
	e.nodes = append(e.nodes, n)
	return n, nil
}

func (n *node) close() {
	n.r.Close()
	<-n.ran
	_ = n.cli.Close()
	n.ran <- nil // a second close returns at once
}

// shutdown stops n gracefully.
func (n *node) shutdown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := n.r.Shutdown(ctx)
	<-n.ran
	_ = n.cli.Close()
	n.ran <- nil
	return err
}

// live returns the nodes whose runner runs.
func (e *env) live() []*node {
	var out []*node
	for _, n := range e.nodes {
		if n.r.Status().Phase != "stopped" {
			out = append(out, n)
		}
	}
	return out
}

// waitOwned waits until the live runners own every shard exactly once and
// agree on the assignment.
func (e *env) waitOwned(ctx context.Context, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		owned, total := make([]bool, e.p.shards), 0
		live := e.live()
		var a sharding.Assignment
		agree := true
		for i, n := range live {
			ai := n.r.Assignment()
			if i > 0 && !slices.Equal(ai, a) {
				agree = false
			}
			a = ai
			for id := range n.r.Owned() {
				if !owned[id] {
					owned[id] = true
					total++
				}
			}
		}
		if agree && total == e.p.shards {
			return time.Since(start), nil
		}
		if time.Since(start) > limit {
			return time.Since(start), fmt.Errorf("%d of %d shards owned after %v", total, e.p.shards, limit)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// loaded returns the reminders loaded over the live runners.
func (e *env) loaded() int64 {
	var n int64
	for _, nd := range e.live() {
		n += nd.r.Status().Reminders
	}
	return n
}

// put writes reminders straight into etcd (bulk setup: each record as a
// registration would write it, epoch 1), in transactions of 128 puts, 8
// at a time.
func (e *env) put(ctx context.Context, rs []storage.Reminder) error {
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	for chunk := range slices.Chunk(rs, storage.MaxTxnOps) {
		ops := make([]clientv3.Op, len(chunk))
		for i, r := range chunk {
			r.Epoch = 1
			v, err := storage.EncodeReminder(r)
			if err != nil {
				return err
			}
			ops[i] = clientv3.OpPut("/"+e.ns+"/"+storage.ReminderKey(r.Shard, r.Entity, r.Name), string(v))
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

// reminders returns n reminders of entities b0..b(n-1), "r", the first
// due at first(i), every period (0: one-shot).
func (e *env) reminders(n int, first func(i int) time.Time, period time.Duration) []storage.Reminder {
	out := make([]storage.Reminder, n)
	for i := range out {
		id := fmt.Sprint("b", i)
		out[i] = storage.Reminder{Shard: sharding.ShardOf(id, e.p.shards), Entity: storage.EntityRef{Kind: benchKind.Name(), ID: id},
			Name: "r", Method: tick.Name(), First: first(i), Period: period}
	}
	return out
}

// revision returns etcd's current revision.
func (e *env) revision(ctx context.Context) (int64, error) {
	resp, err := e.cli.Get(ctx, "/"+e.ns+"/cluster", clientv3.WithCountOnly())
	if err != nil {
		return 0, err
	}
	return resp.Header.Revision, nil
}

// The bench entity: its reminder handler records each tick; register
// registers one from a handler and returns how long Register took.
type benchEntity struct{ id string }

type registerReq struct {
	Period time.Duration
}

var (
	benchKind = entity.NewKind("bench", func(id string) *benchEntity { return &benchEntity{id: id} },
		entity.IdleAfter(time.Hour))
	register = entity.Method(benchKind, "register", (*benchEntity).Register)
	tick     = entity.Reminder(benchKind, "tick", (*benchEntity).Tick)
)

func (b *benchEntity) Register(ctx context.Context, r registerReq) (time.Duration, error) {
	start := time.Now()
	err := tick.Register(ctx, "r", entity.Schedule{Period: r.Period}, "")
	return time.Since(start), err
}

func (b *benchEntity) Tick(ctx context.Context, t entity.ReminderTick[string]) error {
	info, _ := runner.ShardInfoFrom(ctx)
	active.rec.add(b.id, info.Runner, t, time.Now())
	return nil
}

// active is the env whose tick log the handlers write to (one scenario
// runs at a time).
var active struct{ rec *tickLog }

// tickLog records fires: their lag and, per entity, their sequence.
type tickLog struct {
	mu     sync.Mutex
	fires  int64
	lags   []time.Duration // sampled: every fire while sampling
	sample bool
	seqs   map[string][]fireRec // only while keeping sequences
	keep   bool
}

type fireRec struct {
	runner      string
	tick        uint64
	missed      uint64
	redelivered bool
	at          time.Time
}

func newTickLog() *tickLog { return &tickLog{seqs: map[string][]fireRec{}} }

func (l *tickLog) add(id, runner string, t entity.ReminderTick[string], now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fires++
	if l.sample {
		l.lags = append(l.lags, now.Sub(t.Due))
	}
	if l.keep {
		l.seqs[id] = append(l.seqs[id], fireRec{runner: runner, tick: t.Tick, missed: t.Missed, redelivered: t.Redelivered, at: now})
	}
}

func (l *tickLog) count() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fires
}

func quantiles(ds []time.Duration) (p50, p99, mx time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0
	}
	ds = slices.Clone(ds)
	slices.Sort(ds)
	q := func(f float64) time.Duration { return ds[int(f*float64(len(ds)-1))] }
	return q(0.5), q(0.99), ds[len(ds)-1]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

var _ io.Writer = os.Stdout
