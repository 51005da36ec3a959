package runner_test

import (
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/memory"
	"github.com/shardhost/shardhost/transport"
)

// TestClusterRunsInsideSynctest: with the in-memory transport and store, a
// whole cluster — two hosting runners, a client-only gateway, a third
// runner joining by handoff — runs inside a synctest bubble, with no
// socket: a gateway's asks reach the owners over the transport seam, and
// none fails while shards move.
func TestClusterRunsInsideSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		net := transport.NewInmemNetwork()
		_, k, do := newWho()
		cfg := func(id string) runner.Config {
			return runner.Config{ID: id, NumShards: 16, Transport: net.Transport(id + ":7100")}
		}
		a, b := start(t, c, nil, cfg("a")), start(t, c, nil, cfg("b"))
		gwCfg := cfg("gw")
		gwCfg.ClientOnly = true
		gw := start(t, c, nil, gwCfg)
		for _, r := range []*started{a, b, gw} {
			if err := r.Register(k); err != nil {
				t.Fatal(err)
			}
		}
		waitFor(t, 30*time.Second, "a and b own all", func() bool { ok, _ := partitionOK([]*started{a, b}, 16); return ok })
		ctx := t.Context()
		served := map[string]int{}
		ask := func(n int) {
			for i := range n {
				resp, err := do.Ask(ctx, gw, fmt.Sprintf("e%d", i%50), whoReq{})
				if err != nil {
					t.Fatalf("ask %d: %v", i, err)
				}
				served[resp.Runner]++
			}
		}
		ask(200)
		if served["a"] == 0 || served["b"] == 0 {
			t.Fatalf("asks served %v, want both owners", served)
		}
		c3 := start(t, c, nil, cfg("c"))
		if err := c3.Register(k); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { defer close(done); ask(500) }()
		waitFor(t, 30*time.Second, "a, b and c own all", func() bool { ok, _ := partitionOK([]*started{a, b, c3}, 16); return ok })
		<-done
		ask(200)
		if served["c"] == 0 {
			t.Fatalf("asks served %v, want the newcomer too", served)
		}
	})
}
