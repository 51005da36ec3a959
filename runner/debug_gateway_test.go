package runner_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/runner"
)

// TestDebugGatewayShowsItsRouting: the debug page of a gateway (a
// client-only runner) that has served traffic says it routes — not that
// it is starting — with its readiness, the hosting runners it sees and
// the shards it has a route for, in the JSON and on the page.
func TestDebugGatewayShowsItsRouting(t *testing.T) {
	t.Parallel()
	const shards = 64
	_, rs, gw := remoteCluster(t, 2, shards, 0)
	for i := range 50 {
		if _, err := whereMethod.Ask(t.Context(), gw, fmt.Sprint("e", i), whereReq{}); err != nil {
			t.Fatal(err)
		}
	}
	srv := newServer(t, gw.DebugHandler(runner.DebugConfig{}))
	var st runner.DebugState
	waitFor(t, 10*time.Second, "the gateway's page showing it routes to both runners", func() bool {
		st = getState(t, srv.URL+"?format=json")
		return st.Self.Gateway != nil && st.Self.Gateway.Members == len(rs)
	})
	g := st.Self.Gateway
	if st.Self.Phase != "routing" || !g.Ready || g.Reason != "routing to 2 runners" || g.Routes != shards {
		t.Errorf("gateway self: phase %q, gateway %+v; want routing, ready, routes to all %d shards", st.Self.Phase, *g, shards)
	}
	if hs := getState(t, newServer(t, rs[0].DebugHandler(runner.DebugConfig{})).URL+"?format=json"); hs.Self.Gateway != nil || hs.Self.Phase != "attached" {
		t.Errorf("a hosting runner's self: phase %q, gateway %+v; want attached, no gateway view", hs.Self.Phase, hs.Self.Gateway)
	}
	page := string(get(t, srv.URL))
	for _, want := range []string{`id="gateway"`, "routing to 2 runners", "shards routed</span>64 of 64"} {
		if !strings.Contains(page, want) {
			t.Errorf("the gateway's page lacks %q", want)
		}
	}
	if strings.Contains(page, ">starting<") {
		t.Errorf("the gateway's page says starting")
	}
}
