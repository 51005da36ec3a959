package runner

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner/internal/routing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
)

type echo struct{}

type echoReq struct {
	Text  string
	Fail  string
	Panic bool
	Pad   int // response padding (bytes)
}

type echoResp struct {
	Text   string
	Runner string
	Pad    string
}

func (echo) Echo(ctx context.Context, r echoReq) (echoResp, error) {
	if r.Panic {
		panic("echo exploded")
	}
	if r.Fail != "" {
		return echoResp{}, errors.New(r.Fail)
	}
	info, _ := ShardInfoFrom(ctx)
	return echoResp{Text: r.Text, Runner: info.Runner, Pad: strings.Repeat("x", r.Pad)}, nil
}

var (
	echoKind   = entity.NewKind("echo", func(string) *echo { return &echo{} })
	echoMethod = entity.Method(echoKind, "echo", (*echo).Echo)
)

// testCluster runs runners on one memory cluster with real gRPC transports
// on loopback.
type testCluster struct {
	t  *testing.T
	c  *memory.Cluster
	rs map[string]*Runner
}

func newTestCluster(t *testing.T) *testCluster {
	tc := &testCluster{t: t, c: memory.NewCluster(), rs: map[string]*Runner{}}
	t.Cleanup(tc.c.Close)
	return tc
}

func (tc *testCluster) start(cfg Config) *Runner {
	t := tc.t
	t.Helper()
	cfg.NumShards = 16
	if !cfg.ClientOnly {
		cfg.ListenAddr = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if !cfg.RequireClusterPeers { // which needs the default transport (and is not observed)
		cfg.Transport = NewServeObserver(cfg) // observe(r, f) shows f what r answers
	}
	r, err := New(tc.c.NewStore(cfg.ID), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(echoKind); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(context.Background()) }()
	for r.Status().Phase == "new" { // Send fails with ErrClosed before Run
		time.Sleep(time.Millisecond)
	}
	t.Cleanup(func() { r.Close(); <-done })
	tc.rs[cfg.ID] = r
	return r
}

func (tc *testCluster) waitOwned(total int) {
	tc.t.Helper()
	for p := testenv.NewPatience(10 * time.Second); ; p.Sleep(5 * time.Millisecond) {
		n := 0
		for _, r := range tc.rs {
			n += len(r.Owned())
		}
		if n == total {
			return
		}
		if p.Over() {
			tc.t.Fatalf("runners own %d of %d shards after %v", n, total, p)
		}
	}
}

// waitSettled waits until every hosting runner owns some shards, all
// runners agree on the assignment, and each shard is owned by its assignee
// and seen so by every runner's lock view.
func (tc *testCluster) waitSettled() {
	tc.t.Helper()
	for p := testenv.NewPatience(10 * time.Second); ; p.Sleep(5 * time.Millisecond) {
		why := tc.settled()
		if why == "" {
			return
		}
		if p.Over() {
			tc.t.Fatalf("not settled after %v: %s", p, why)
		}
	}
}

func (tc *testCluster) settled() string {
	var a sharding.Assignment
	for _, r := range tc.rs {
		if a == nil {
			a = r.Assignment()
		}
		if !slices.Equal(r.Assignment(), a) {
			return "runners disagree on the assignment"
		}
	}
	if len(a) != 16 {
		return "no assignment yet"
	}
	for id, r := range tc.rs {
		if r.cfg.ClientOnly {
			continue
		}
		owned := r.Owned()
		if len(owned) == 0 {
			return id + " owns no shard"
		}
		for s := range owned {
			if a[s] != id {
				return fmt.Sprintf("%s owns shard %d, assigned to %s", id, s, a[s])
			}
		}
	}
	for s, assignee := range a {
		if _, ok := tc.rs[assignee].Owned()[sharding.ShardID(s)]; !ok {
			return fmt.Sprintf("shard %d not owned by its assignee %s", s, assignee)
		}
		for id, r := range tc.rs {
			if !r.view.full {
				continue // it sees only the locks that concern it
			}
			if o, _ := r.OwnerOf(sharding.ShardID(s)); o != assignee {
				return fmt.Sprintf("%s sees shard %d owned by %q, assigned to %s", id, s, o, assignee)
			}
		}
	}
	return ""
}

// observe makes f see every request r's transport answers from now on
// (r started by testCluster.start).
func observe(r *Runner, f func(*transport.DeliverRequest, *transport.DeliverResponse)) {
	r.net.(*ServeObserver).Observe(f)
}

// serveLog records what a runner's transport answered, by sender.
type serveLog struct {
	mu  sync.Mutex
	got []string // "sender code"
}

func (l *serveLog) hook(req *transport.DeliverRequest, resp *transport.DeliverResponse) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.got = append(l.got, req.Sender+" "+resp.Code.String())
}

func (l *serveLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

// A receiver that is not the owner answers NotOwner with its hint; the
// sender retries at the hinted owner. No receiver forwards.
func TestNotOwnerHintRetriesWithoutSecondHop(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start(Config{ID: "a"})
	b := tc.start(Config{ID: "b"})
	c := tc.start(Config{ID: "c", ClientOnly: true, FullLockView: true})
	tc.waitSettled() // the watches are quiet: nothing will fix the view below
	var la, lb serveLog
	ha, hb := la.hook, lb.hook
	observe(a, ha)
	observe(b, hb)

	var id string
	for i := 0; ; i++ {
		id = "e" + string(rune('a'+i%26)) + strings.Repeat("z", i/26)
		if _, ok := a.Owned()[sharding.ShardOf(id, 16)]; ok {
			break
		}
	}
	// Make c's lock view stale: it believes b owns the shard.
	shard := sharding.ShardOf(id, 16)
	c.mu.Lock()
	l, _ := c.view.locks.Get(shard)
	l.Lease = b.att.lease
	c.view.locks.Set(l)
	c.mu.Unlock()

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := echoMethod.Ask(ctx, c, id, echoReq{Text: "hi"})
	if err != nil || got.Runner != "a" || got.Text != "hi" {
		t.Fatalf("Ask = %+v, %v; want served by a", got, err)
	}
	if g := lb.list(); len(g) != 1 || g[0] != "c NOT_OWNER" {
		t.Errorf("b answered %v, want one NOT_OWNER to c", g)
	}
	if g := la.list(); len(g) != 1 || g[0] != "c OK" {
		t.Errorf("a answered %v, want one OK to c (no request forwarded by b)", g)
	}
}

func TestTypedErrorsSurviveTheWire(t *testing.T) {
	tc := newTestCluster(t)
	a := tc.start(Config{ID: "a", MaxMessageSize: 4096})
	c := tc.start(Config{ID: "c", ClientOnly: true, MaxMessageSize: 1 << 20})
	tc.waitOwned(16)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr := a.Address()
	shardOf := func(id string) uint32 { return uint32(sharding.ShardOf(id, 16)) }
	raw := func(req *transport.DeliverRequest) error {
		t.Helper()
		resp, _, err := c.net.Call(ctx, addr, req)
		if err != nil {
			return err
		}
		err, _ = routing.ResponseError("a", req, resp)
		return err
	}
	good, _ := entity.JSON.Marshal(echoReq{Text: "x"})

	checks := []struct {
		name string
		err  error
		want error
	}{
		{"unknown kind", raw(&transport.DeliverRequest{Kind: "nope", Method: "echo", Entity: "k", Shard: shardOf("k"), Payload: good}), entity.ErrUnknownKind},
		{"unknown method", raw(&transport.DeliverRequest{Kind: "echo", Method: "nope", Entity: "k", Shard: shardOf("k"), Payload: good}), entity.ErrUnknownMethod},
		{"undecodable payload", raw(&transport.DeliverRequest{Kind: "echo", Method: "echo", Entity: "k", Shard: shardOf("k"), Payload: []byte("{not json")}), entity.ErrBadRequest},
		{"shard count mismatch", raw(&transport.DeliverRequest{Kind: "echo", Method: "echo", Entity: "k", Shard: shardOf("k") + 1, Payload: good}), entity.ErrBadRequest},
		{"over the receiver's limit", raw(&transport.DeliverRequest{Kind: "echo", Method: "echo", Entity: "k", Shard: shardOf("k"), Payload: make([]byte, 64<<10)}), ErrMessageTooLarge},
	}
	for _, ch := range checks {
		if !errors.Is(ch.err, ch.want) {
			t.Errorf("%s: err = %v, want %v", ch.name, ch.err, ch.want)
		}
	}
	// Through the typed API.
	if _, err := echoMethod.Ask(ctx, c, "k", echoReq{Text: strings.Repeat("y", 2<<20)}); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("oversized request = %v, want ErrMessageTooLarge (not sent)", err)
	}
	if _, err := echoMethod.Ask(ctx, c, "k", echoReq{Pad: 8192}); !errors.Is(err, ErrMessageTooLarge) {
		t.Errorf("oversized response = %v, want ErrMessageTooLarge", err)
	}
	var re *RemoteError
	if _, err := echoMethod.Ask(ctx, c, "k", echoReq{Fail: "insufficient funds"}); !errors.As(err, &re) || re.Message != "insufficient funds" || re.Runner != "a" {
		t.Errorf("handler error = %v, want *RemoteError with the message", err)
	}
	var pe *entity.PanicError
	if _, err := echoMethod.Ask(ctx, c, "k", echoReq{Panic: true}); !errors.As(err, &pe) || pe.Value != "echo exploded" {
		t.Errorf("handler panic = %v, want *entity.PanicError", err)
	}
	// The runner keeps serving.
	if got, err := echoMethod.Ask(ctx, c, "k", echoReq{Text: "still here"}); err != nil || got.Text != "still here" {
		t.Fatalf("after bad input: %+v, %v", got, err)
	}
}
