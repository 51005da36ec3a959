package runner

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner/internal/routing"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
)

// startTweaked runs a runner on c after tweak (called before Run) and
// waits until Run has started.
func startTweaked(t *testing.T, c *memory.Cluster, cfg Config, tweak func(*Runner)) *Runner {
	t.Helper()
	cfg.NumShards = 16
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := New(c.NewStore(cfg.ID), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Register(echoKind); err != nil {
		t.Fatal(err)
	}
	if tweak != nil {
		tweak(r)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(context.Background()) }()
	t.Cleanup(func() { r.Close(); <-done })
	for r.Status().Phase == "new" {
		time.Sleep(time.Millisecond)
	}
	return r
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.WaitFor(t, d, what, cond)
}

// The receiving side checks the context first too: a delivery whose
// context ended (in transit, or the stream broke) is answered UNDELIVERED
// and no entity is even created.
func TestDeliverHereRefusesEndedContext(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	a := startTweaked(t, c, Config{ID: "a", ListenAddr: "127.0.0.1:0"}, nil)
	waitUntil(t, 10*time.Second, "a owns all shards", func() bool { return len(a.Owned()) == 16 })
	payload, _ := entity.JSON.Marshal(echoReq{Text: "x"})
	req := &transport.DeliverRequest{Kind: "echo", Method: "echo", Entity: "k", Shard: uint32(sharding.ShardOf("k", 16)), Payload: payload, Codec: entity.JSON.Name()}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	resp, written := a.router.Receiver().Deliver(ctx, req)
	written()
	if resp.Code != transport.CodeUndelivered {
		t.Fatalf("deliverHere(ended context) = %v %q, want UNDELIVERED", resp.Code, resp.Message)
	}
	if err, retry := routing.ResponseError("a", req, resp); !retry || err == nil {
		t.Errorf("the sender reads %v (retry %v), want a not-delivered error", err, retry)
	}
	if n := a.Status().Entities; n != 0 {
		t.Errorf("%d entities created for a delivery whose context had ended", n)
	}
	resp, written = a.router.Receiver().Deliver(context.Background(), req)
	written()
	if resp.Code != transport.CodeOK {
		t.Fatalf("deliverHere = %v %q", resp.Code, resp.Message)
	}
	// The host refuses it too (the local path, after Send's own check).
	sh := a.hosting.Lookup(sharding.ShardOf("k", 16))
	k := a.hosting.Kind("echo")
	h, _ := k.Desc.Handler("echo")
	var ud *UndeliveredError
	if res := sh.Deliver(ctx, k, h, "k", echoReq{}, false, false, false); !res.Undelivered || !errors.As(res.Err, &ud) || !errors.Is(res.Err, context.Canceled) {
		t.Errorf("deliver(ended context) = %v (undelivered %v), want a not-sent *UndeliveredError matching context.Canceled", res.Err, res.Undelivered)
	}
}

// A send that saw "not running" just before Run began (`go r.Run(ctx)`
// then an Ask, the README's pattern) is admitted, not refused with
// ErrClosed as if Run had returned: the interleaving that made
// examples/metrics fail once in CI, replayed step by step.
func TestAdmissionRacingRunsBeginIsAdmitted(t *testing.T) {
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	r, err := New(c.NewStore("a"), Config{ID: "a", NumShards: 4, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if r.running.Load() {
		t.Fatal("running before Run")
	}
	// The send's admission read "not running" here; Run begins now.
	if err := r.begin(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := r.waitRun(ctx); err != nil {
		t.Fatalf("waitRun after Run began = %v; want the send admitted", err)
	}
	// After Run has returned, the same admission refuses with ErrClosed.
	r.running.Store(false)
	close(r.sig.done)
	if err := r.waitRun(ctx); !errors.Is(err, ErrClosed) {
		t.Fatalf("waitRun after Run returned = %v; want ErrClosed", err)
	}
}
