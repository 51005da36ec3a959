package runner_test

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/memory"
)

var scaleRunners = flag.Int("scale.runners", 100, "hosting runners of TestCoordinationWorkFollowsWhatMoved (1000: the scale the design is for; make test runs 100)")

// What a runner hears and asks during one membership change, in
// TestCoordinationWorkFollowsWhatMoved: the bounds it checks.
const (
	// All runners together hear at most this many coordination events
	// (locks, handoff records, notices: everything but membership) per
	// moved shard, plus coordSlack.
	coordPerMoved = 20
	coordSlack    = 20
	// A runner no shard moved to or from hears at most this many
	// membership events (runner records, drains) and makes at most this
	// many store calls besides its lease renewals and verifications.
	uninvolvedEvents = 4
	uninvolvedCalls  = 2
)

// TestCoordinationWorkFollowsWhatMoved: a runner hears only what concerns
// it. A cluster of -scale.runners runners (in-memory store, virtual time)
// settles; then a runner joins, and later one leaves gracefully. For each
// change the test measures, per runner, the watch events delivered to it
// and the store calls it made, and demands that the coordination events
// heard in all stay within coordPerMoved per moved shard (a broadcast
// design delivers every lock change to every runner: O(moved x runners)),
// and that a runner no shard moved to or from hears membership alone and
// makes no store call beyond its periodic ones. It prints the figures.
func TestCoordinationWorkFollowsWhatMoved(t *testing.T) {
	if testing.Short() {
		t.Skip("a cluster of many runners")
	}
	n := *scaleRunners
	const numShards = 2048
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		defer c.Close()
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		type node struct {
			id    string
			r     *runner.Runner
			store *memory.Store
			done  chan struct{}
		}
		var (
			mu    sync.Mutex
			nodes = map[string]*node{}
		)
		startNode := func(id string) *node {
			st := c.NewStore(id)
			r, err := runner.New(st, runner.Config{ID: id, NumShards: numShards, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			nd := &node{id: id, r: r, store: st, done: make(chan struct{})}
			go func() { defer close(nd.done); _ = r.Run(context.Background()) }()
			mu.Lock()
			nodes[id] = nd
			mu.Unlock()
			return nd
		}
		defer func() {
			mu.Lock()
			defer mu.Unlock()
			for _, nd := range nodes {
				nd.r.Close()
				<-nd.done
			}
		}()
		// settled waits until the runners agree on the assignment and own
		// exactly its shards, then for their views to go quiet, and
		// returns the assignment.
		settled := func(what string) sharding.Assignment {
			t.Helper()
			deadline := time.Now().Add(5 * time.Minute)
			for {
				mu.Lock()
				var digest uint64
				owned, agree := 0, true
				for _, nd := range nodes {
					st := nd.r.Status()
					if st.AssignmentDigest == 0 || digest != 0 && st.AssignmentDigest != digest {
						agree = false
						break
					}
					digest = st.AssignmentDigest
					owned += st.Owned
				}
				mu.Unlock()
				if agree && owned == numShards {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: not settled after 5 minutes (virtual)", what)
				}
				time.Sleep(50 * time.Millisecond)
			}
			time.Sleep(5 * time.Second) // the last notices and records are deleted, the views go quiet
			synctest.Wait()
			mu.Lock()
			defer mu.Unlock()
			var a sharding.Assignment
			for _, nd := range nodes {
				a = nd.r.Assignment()
				for id := range nd.r.Owned() {
					if a[id] != nd.id {
						t.Fatalf("%s: shard %d owned by %s, assigned to %s", what, id, nd.id, a[id])
					}
				}
			}
			return a
		}
		type heard struct {
			membership, coordination, calls int
		}
		// snapshot returns what each runner heard and asked so far.
		snapshot := func() map[string]heard {
			mu.Lock()
			defer mu.Unlock()
			out := map[string]heard{}
			for id, nd := range nodes {
				var h heard
				for prefix, k := range nd.store.Delivered() {
					if strings.HasPrefix(prefix, "runners/") || strings.HasPrefix(prefix, "drains/") {
						h.membership += k
					} else {
						h.coordination += k
					}
				}
				for op, k := range nd.store.CallCounts() {
					if op != memory.OpKeepAlive && op != memory.OpVerify {
						h.calls += k
					}
				}
				out[id] = h
			}
			return out
		}
		// change makes one membership change and checks what it cost.
		change := func(what string, before sharding.Assignment, do func() string) sharding.Assignment {
			t.Helper()
			h0 := snapshot()
			subject := do()
			after := settled(what)
			h1 := snapshot()
			involved := map[string]bool{subject: true}
			moved := 0
			for s := range after {
				if before[s] != after[s] {
					moved++
					involved[before[s]], involved[after[s]] = true, true
				}
			}
			var coord, member, worstEvents, worstCalls int
			var worstEventsID, worstCallsID string
			for id, h := range h1 {
				d := heard{h.membership - h0[id].membership, h.coordination - h0[id].coordination, h.calls - h0[id].calls}
				coord += d.coordination
				member += d.membership
				if involved[id] {
					continue
				}
				if e := d.membership + d.coordination; e > worstEvents {
					worstEvents, worstEventsID = e, id
				}
				if d.calls > worstCalls {
					worstCalls, worstCallsID = d.calls, id
				}
				if d.coordination > 0 || d.membership > uninvolvedEvents || d.calls > uninvolvedCalls {
					t.Errorf("%s: %s, which no shard moved to or from, heard %d coordination and %d membership events and made %d store calls (want 0, <= %d, <= %d)",
						what, id, d.coordination, d.membership, d.calls, uninvolvedEvents, uninvolvedCalls)
				}
			}
			if moved == 0 {
				t.Fatalf("%s moved no shard", what)
			}
			if coord > coordPerMoved*moved+coordSlack {
				t.Errorf("%s: the runners heard %d coordination events for %d moved shards (%.1f each; want <= %d each + %d)",
					what, coord, moved, float64(coord)/float64(moved), coordPerMoved, coordSlack)
			}
			t.Logf("%s at %d runners x %d shards: %d shards moved among %d runners; coordination events heard %d in all (%.1f per moved shard), membership events %d in all (%.1f per runner); a runner not involved heard at most %d events (%s) and made at most %d store calls besides renewals and verifications (%s)",
				what, len(h1), numShards, moved, len(involved), coord, float64(coord)/float64(moved), member, float64(member)/float64(len(h1)),
				worstEvents, worstEventsID, worstCalls, worstCallsID)
			return after
		}
		for i := range n {
			startNode(fmt.Sprintf("r%04d", i))
		}
		a := settled("cold start")
		a = change("a join", a, func() string { return startNode("joiner").id })
		change("a graceful leave", a, func() string {
			mu.Lock()
			nd := nodes["r0000"]
			delete(nodes, "r0000")
			mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := nd.r.Shutdown(ctx); err != nil {
				t.Errorf("shutdown of r0000: %v", err)
			}
			<-nd.done
			return nd.id
		})
	})
}
