package runner_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
)

// gated is an entity whose handler blocks, ignoring its context, until the
// test opens the gate — a handler that was running when its process froze
// or lost etcd — and then writes a fenced checkpoint with the epoch it was
// activated under, as a handler persisting its state would.
type gated struct {
	id         string
	n          int64
	epoch      int64
	checkpoint func(context.Context, []byte) error
	env        *gateEnv
}

type gateEnv struct {
	gate    chan struct{} // closed by the test: blocked handlers return
	started chan string   // "runner/entity" when a blocked handler starts
	mu      sync.Mutex
	writes  map[string]error // entity -> the released handler's checkpoint result
}

type gateReq struct{ Block bool }

type gateResp struct {
	N     int64
	Epoch int64
}

func (g *gated) Activate(_ context.Context, info entity.ActivateInfo) error {
	g.epoch, g.checkpoint = info.Epoch, info.Checkpoint
	return nil
}

func (g *gated) Do(ctx context.Context, r gateReq) (gateResp, error) {
	g.n++
	if r.Block {
		info, _ := runner.ShardInfoFrom(ctx)
		g.env.started <- info.Runner
		<-g.env.gate
		// Retried while the store is unreachable (the connection through
		// the proxy may still be broken): the answer that counts is the
		// store's.
		wctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := g.checkpoint(wctx, []byte("late"))
		for errors.Is(err, storage.ErrUnavailable) && wctx.Err() == nil {
			time.Sleep(50 * time.Millisecond)
			err = g.checkpoint(wctx, []byte("late"))
		}
		cancel()
		g.env.mu.Lock()
		g.env.writes[info.Runner+"/"+g.id] = err
		g.env.mu.Unlock()
	}
	return gateResp{N: g.n, Epoch: g.epoch}, nil
}

func newGated() (*gateEnv, *entity.Kind[gated], *entity.MethodRef[gated, gateReq, gateResp]) {
	env := &gateEnv{gate: make(chan struct{}), started: make(chan string, 8), writes: map[string]error{}}
	k := entity.NewKind("gated", func(id string) *gated { return &gated{id: id, env: env} })
	return env, k, entity.Method(k, "do", (*gated).Do)
}

// TestLateHandlerOfCutOffOwner is the paused-owner scenario on a real etcd:
// handlers of runner a block (ignoring their context); a is cut off from
// etcd (toxiproxy) until it detaches and its lease expires; b takes the
// shard and serves the same entities from fresh instances; then a's
// handlers are released. Their results must never be acknowledged — not to
// a caller on a itself nor to a client-only gateway — and their fenced
// writes under a's old epoch must be rejected.
func TestLateHandlerOfCutOffOwner(t *testing.T) {
	t.Parallel()
	srv := testenv.StartEtcd(t)
	tox := testenv.StartToxiproxy(t)
	proxy := tox.Proxy(t, "etcd-late", srv.Endpoint())
	c := newCluster(t, []string{srv.Endpoint()}, srv.Client(t))
	env, k, do := newGated()
	const n = 4
	cfg := func(id string) runner.Config {
		return runner.Config{ID: id, NumShards: n, LeaseTTL: 3 * time.Second, ListenAddr: "127.0.0.1:0"}
	}
	a := c.start(cfg("a"), proxy.Addr())
	b := c.start(cfg("b"))
	gw := c.start(runner.Config{ID: "gw", NumShards: n, ClientOnly: true})
	for _, r := range []*etcdRunner{a, b, gw} {
		if err := r.Register(k); err != nil {
			t.Fatal(err)
		}
	}
	c.waitPartition([]*etcdRunner{a, b}, n, 30*time.Second)
	var shard sharding.ShardID
	var epoch storage.Epoch
	for id, e := range a.Owned() {
		shard, epoch = id, e
		break
	}
	remoteID, localID := idFor(shard, n, "remote-"), idFor(shard, n, "local-")
	waitFor(t, 10*time.Second, "the gateway routes the shard to a", func() bool { o, _ := gw.OwnerOf(shard); return o == "a" })

	type outcome struct {
		resp gateResp
		err  error
	}
	ask := func(r *etcdRunner, id string) <-chan outcome {
		ch := make(chan outcome, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			resp, err := do.Ask(ctx, r, id, gateReq{Block: true})
			ch <- outcome{resp, err}
		}()
		return ch
	}
	viaGateway := ask(gw, remoteID)
	onA := ask(a, localID)
	for range 2 {
		if who := <-env.started; who != "a" {
			t.Fatalf("a blocked handler started on %s, want a", who)
		}
	}

	proxy.Blackhole(t)
	waitFor(t, 30*time.Second, "b owns the shard", func() bool { _, ok := b.Owned()[shard]; return ok })
	if !a.Status().Detached {
		t.Fatal("b owns a's shard but a is not detached")
	}
	newEpoch := b.Owned()[shard]
	// b serves the entities from fresh instances while a's handlers hang.
	for _, id := range []string{remoteID, localID} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		resp, err := do.Ask(ctx, gw, id, gateReq{})
		cancel()
		if err != nil || resp.N != 1 || resp.Epoch != int64(newEpoch) {
			t.Fatalf("ask %s on the new owner = %+v, %v; want N 1 under epoch %d", id, resp, err, newEpoch)
		}
	}
	// a reaches etcd again (its writes can be judged by fencing), then its
	// handlers finish.
	proxy.Clear(t)
	close(env.gate)

	for name, ch := range map[string]<-chan outcome{"gateway (remote)": viaGateway, "a (local)": onA} {
		o := <-ch
		var stale *runner.StaleResultError
		if !errors.As(o.err, &stale) || !errors.Is(o.err, runner.ErrMaybeDelivered) {
			t.Errorf("%s caller got %+v, %v; want a *StaleResultError (ErrMaybeDelivered), never the late value", name, o.resp, o.err)
			continue
		}
		if stale.Runner != "a" || stale.Epoch != epoch || stale.Newer != 0 || !errors.Is(o.err, runner.ErrDetached) {
			t.Errorf("%s caller: %+v; want a's own refusal (Newer 0) of epoch %d, cause ErrDetached", name, stale, epoch)
		}
	}
	env.mu.Lock()
	defer env.mu.Unlock()
	for _, key := range []string{"a/" + remoteID, "a/" + localID} {
		err, ok := env.writes[key]
		var fenced *storage.FencedError
		switch {
		case !ok:
			t.Errorf("%s: the released handler wrote no checkpoint", key)
		case !errors.As(err, &fenced) || fenced.Epoch != epoch || fenced.Current != newEpoch:
			t.Errorf("%s: late checkpoint write = %v; want fenced (epoch %d, current %d)", key, err, epoch, newEpoch)
		}
	}
	checkSingleOwner(t, c.rec.all())
}
