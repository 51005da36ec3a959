package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// owners returns the owner of every shard by the nodes' own view ("" for
// a shard none of them owns).
func owners(nodes []*node, shards int) sharding.Assignment {
	out := make(sharding.Assignment, shards)
	for _, n := range nodes {
		for s := range n.Owned() {
			out[s] = n.ID()
		}
	}
	return out
}

// planned runs `plan ARGS -json` against base and returns the plan.
func planned(t *testing.T, base []string, args ...string) Plan {
	t.Helper()
	var p Plan
	ctlJSON(t, &p, append(append(slices.Clone(base), "plan"), args...)...)
	return p
}

// waitOwners waits until the nodes own every shard as want says and agree
// with it (their computed assignment), for at most 30 s.
func waitOwners(t *testing.T, what string, nodes []*node, want sharding.Assignment) {
	t.Helper()
	waitFor(t, 30*time.Second, what+": the cluster owning the shards as planned", func() bool {
		for _, n := range nodes {
			if !slices.Equal(n.Assignment(), want) {
				return false
			}
		}
		return slices.Equal(owners(nodes, len(want)), want)
	})
}

// checkMoves: the plan's moves are exactly the shards whose owner differs
// between before (the owners when it was made) and its assignment.
func checkMoves(t *testing.T, p Plan, before sharding.Assignment) {
	t.Helper()
	var want []PlanMove
	for s := range before {
		if before[s] != p.Assignment[s] {
			want = append(want, PlanMove{Shard: sharding.ShardID(s), From: before[s], To: p.Assignment[s]})
		}
	}
	if !slices.Equal(p.Moves, want) && !(len(p.Moves) == 0 && len(want) == 0) {
		t.Errorf("plan %+v moves %v, want %v", p.Change, p.Moves, want)
	}
	in, out := map[string]int{}, map[string]int{}
	for _, m := range want {
		in[m.To]++
		out[m.From]++
	}
	for _, r := range p.Runners {
		if r.In != in[r.ID] || r.Out != out[r.ID] || r.After != len(p.Assignment.ShardsOf(r.ID)) || r.Owned != len(before.ShardsOf(r.ID)) {
			t.Errorf("plan %+v row %+v; want in %d, out %d, after %d, owned %d", p.Change, r, in[r.ID], out[r.ID],
				len(p.Assignment.ShardsOf(r.ID)), len(before.ShardsOf(r.ID)))
		}
	}
}

// TestPlanMatchesWhatTheClusterDoes: on a real cluster, for each strategy a
// runner can be configured with, `plan` says before each change exactly
// which shards the cluster then moves and where every shard ends: a runner
// joining (with a weight), one changing its weight (a restart with
// another weight), one drained, one leaving.
func TestPlanMatchesWhatTheClusterDoes(t *testing.T) {
	const shards = 32
	srv := testenv.StartEtcd(t)
	ep := srv.Endpoint()
	for _, strategy := range []sharding.Strategy{sharding.Balanced(), sharding.StickyBalanced()} {
		t.Run(strategy.Name(), func(t *testing.T) {
			ns := "plan-" + strategy.Name()
			base := []string{"-endpoints", ep, "-namespace", ns}
			start := func(id string, weight int) *node {
				return startRunnerWith(t, ep, ns, runner.Config{ID: id, NumShards: shards, Strategy: strategy, Weight: weight})
			}
			stop := func(n *node) {
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				defer cancel()
				if err := n.Shutdown(ctx); err != nil {
					t.Fatal(err)
				}
			}
			r1, r2 := start("r1", 1), start("r2", 1)
			nodes := []*node{r1, r2}
			waitFor(t, 15*time.Second, "two runners owning all shards", func() bool { return settled(nodes, shards) })

			// r3 joins with weight 2.
			p := planned(t, base, "join", "r3", "-weight", "2")
			if p.Strategy != strategy.Name() || p.NumShards != shards || len(p.Moves) == 0 {
				t.Fatalf("plan join = strategy %q, %d shards, %d moves; want the cluster's %q, %d, some moves", p.Strategy, p.NumShards, len(p.Moves), strategy.Name(), shards)
			}
			checkMoves(t, p, owners(nodes, shards))
			r3 := start("r3", 2)
			nodes = append(nodes, r3)
			waitOwners(t, "r3 joined", nodes, p.Assignment)

			// r3 restarts with weight 1. A membership-only strategy lands
			// where `plan weight` says; sticky-balanced depends on the path
			// (the graceful stop hands r3's shards to the others first), so
			// its plan is the two steps: leave, then join at the new weight.
			if sharding.IgnoresCurrent(strategy) {
				p = planned(t, base, "weight", "r3", "1")
				checkMoves(t, p, owners(nodes, shards))
				stop(r3)
				r3 = start("r3", 1)
				nodes[2] = r3
				waitOwners(t, "r3 at weight 1", nodes, p.Assignment)
			} else {
				p = planned(t, base, "leave", "r3")
				checkMoves(t, p, owners(nodes, shards))
				stop(r3)
				waitOwners(t, "r3 stopped", nodes[:2], p.Assignment)
				p = planned(t, base, "join", "r3", "-weight", "1")
				checkMoves(t, p, owners(nodes[:2], shards))
				r3 = start("r3", 1)
				nodes[2] = r3
				waitOwners(t, "r3 back at weight 1", nodes, p.Assignment)
			}

			// r1 drained.
			p = planned(t, base, "drain", "r1")
			checkMoves(t, p, owners(nodes, shards))
			if len(p.Assignment.ShardsOf("r1")) != 0 {
				t.Errorf("plan drain r1 leaves r1 %d shards", len(p.Assignment.ShardsOf("r1")))
			}
			if code, out, errOut := ctl(t, append(base, "drain", "r1")...); code != exitOK {
				t.Fatalf("drain r1: exit %d\n%s%s", code, out, errOut)
			}
			waitOwners(t, "r1 drained", nodes, p.Assignment)

			// r2 leaves.
			p = planned(t, base, "leave", "r2")
			checkMoves(t, p, owners(nodes, shards))
			stop(r2)
			nodes = []*node{r1, r3}
			waitOwners(t, "r2 gone", nodes, p.Assignment)

			// The text form says the same.
			code, out, _ := ctl(t, append(base, "plan", "leave", "r3")...)
			if code != exitOK || !strings.Contains(out, "plan: runner r3 leaves") ||
				!strings.Contains(out, fmt.Sprintf("%d shards move", shards)) || !strings.Contains(out, "; 32 would have no runner") {
				t.Errorf("plan leave r3 (the last runner with weight): exit %d\n%s", code, out)
			}
		})
	}
}

// TestPlanRefusesImpossibleChanges: joining a registered runner, leaving
// or draining an unknown one, weights out of range and unknown actions
// are refused with a message, before anything is computed.
func TestPlanRefusesImpossibleChanges(t *testing.T) {
	srv := testenv.StartEtcd(t)
	r1 := startRunner(t, srv.Endpoint(), "refuse", "r1", 8)
	waitFor(t, 15*time.Second, "r1 owning all shards", func() bool { return len(r1.Owned()) == 8 })
	base := []string{"-endpoints", srv.Endpoint(), "-namespace", "refuse", "plan"}
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"join", "r1"}, exitFail, "registered already"},
		{[]string{"leave", "r9"}, exitFail, `no runner "r9"`},
		{[]string{"drain", "r9"}, exitFail, `no runner "r9"`},
		{[]string{"weight", "r1", "2147483648"}, exitUsage, "weight 2147483648"},
		{[]string{"join", "r2", "-weight", "0"}, exitUsage, "plan a drain"},
		{[]string{"weight", "r1"}, exitUsage, "want plan join"},
		{[]string{"swap", "r1"}, exitUsage, "want plan join"},
		{[]string{"join", "a/b"}, exitUsage, "runner ID"},
		{[]string{"join", "r2", "-strategy", "nope"}, exitUsage, "unknown strategy"},
	} {
		code, _, errOut := ctl(t, append(slices.Clone(base), c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.msg) {
			t.Errorf("plan %v: exit %d, %q; want exit %d naming %q", c.args, code, errOut, c.code, c.msg)
		}
	}
}
