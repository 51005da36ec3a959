package runner_test

import (
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
)

// TestEtcdCutOffRunnerDetachesBeforeExpiry puts one of two runners, with the
// default configuration, behind toxiproxy, cuts it off four ways (from a
// single member three ways; from all three members of a cluster, each
// behind a proxy of its own, while its renewals are hedged across them)
// and checks, from events on one clock and from etcd revisions:
//
//	(a) its detach instant (its lease deadline, the send time of its last
//	    acknowledged renewal + TTL, minus DetachMargin) came before the
//	    server deleted its runner key, by at least DetachMargin/2; and its
//	    Detached event no later than that instant, but by as much as this
//	    process was measured unscheduled meanwhile (a starved process acts
//	    late; the handlers' start check reads the clock, so none started
//	    past the instant — hosting's guarantee, tested there);
//	(b) the other runner acquired its shards only after that deletion;
//	(c) at no instant did both own a shard;
//
// and that after the toxic is removed it re-attaches, re-registers and owns
// shards again under new epochs.
func TestEtcdCutOffRunnerDetachesBeforeExpiry(t *testing.T) {
	t.Parallel()
	toxics := []struct {
		name    string
		members int // 1, or 3 with the toxic applied to every member's proxy
		apply   func(t *testing.T, p *testenv.Proxy)
	}{
		{"blackhole", 1, func(t *testing.T, p *testenv.Proxy) { p.Blackhole(t) }},
		{"latency-above-ttl", 1, func(t *testing.T, p *testenv.Proxy) {
			// Both directions: requests reach etcd after the lease expired.
			for _, stream := range []string{"upstream", "downstream"} {
				if _, err := p.Raw().AddToxic("lat-"+stream, "latency", stream, 1, toxiproxy.Attributes{"latency": 6000}); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"reset-peer", 1, func(t *testing.T, p *testenv.Proxy) { p.ResetPeer(t) }},
		{"blackhole-all-of-3-members", 3, func(t *testing.T, p *testenv.Proxy) { p.Blackhole(t) }},
	}
	for _, tc := range toxics {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stalls := testenv.StartStallProbe(t)
			pc := testenv.StartProxiedEtcdCluster(t, max(tc.members, 1))
			proxies := pc.Proxies()
			c := newCluster(t, pc.Endpoints(), pc.Client(t))
			cfg := func(id string) runner.Config {
				return runner.Config{ID: id, NumShards: 64}
			}
			a := c.start(cfg("a"), pc.ProxiedEndpoints()...)
			b := c.start(cfg("b"))
			if ttl := a.Config().LeaseTTL; ttl != runner.DefaultLeaseTTL {
				t.Fatalf("LeaseTTL %v, want the default %v", ttl, runner.DefaultLeaseTTL)
			}
			rs := []*etcdRunner{a, b}
			c.waitPartition(rs, 64, 30*time.Second)
			margin := a.Config().DetachMargin
			deletes := c.watchDeletes("runners/")
			before := a.Owned()
			cut := time.Now()
			for _, p := range proxies {
				tc.apply(t, p)
			}

			// B owns everything once A's lease expired on the server.
			waitFor(t, 30*time.Second, "b owns all 64 shards", func() bool { return len(b.Owned()) == 64 })
			// The test's own watch may deliver the delete after b's
			// acquisitions completed (another client, another goroutine):
			// wait for it. (b) compares revisions, exact whenever the
			// event arrives; a late arrival only widens (a)'s gap.
			waitFor(t, 10*time.Second, "the test's watch sees a's runner key deleted", func() bool {
				_, _, ok := deletes.get("a")
				return ok
			})
			expiredAt, expiredRev, _ := deletes.get("a")
			evs := c.rec.all()
			var detached *runner.Detached
			for _, ev := range evs {
				if d, ok := ev.(runner.Detached); ok && d.Runner == "a" && d.Time.After(cut) {
					detached = &d
					break
				}
			}
			if detached == nil {
				t.Fatal("a never detached")
			}
			instant := detached.Deadline.Add(-margin)
			gap := expiredAt.Sub(instant)
			late, stalled := detached.Time.Sub(instant), stalls.Within(instant, detached.Time)
			t.Logf("%s: cut at 0; a's detach instant at %v, its Detached event at %v (%s; %v of it measured unscheduled); server deleted a's key at %v; gap %v (DetachMargin %v)",
				tc.name, instant.Sub(cut).Round(time.Millisecond), detached.Time.Sub(cut).Round(time.Millisecond), detached.Reason, stalled.Round(time.Millisecond),
				expiredAt.Sub(cut).Round(time.Millisecond), gap.Round(time.Millisecond), margin)
			// (a)
			if gap < margin/2 {
				t.Errorf("(a) a's detach instant came only %v before the server expired its lease, want >= DetachMargin/2 = %v", gap, margin/2)
			}
			if slack := 100 * time.Millisecond; late > stalled+slack {
				t.Errorf("(a) a's Detached event came %v after its detach instant, %v of it measured unscheduled: more than %v late while it ran", late, stalled, slack)
			}
			// (b): by etcd revision, exact.
			for id := range before {
				for _, acq := range acquiredOf(evs, "b")[id] {
					if acq.Time.After(cut) && storage.Revision(acq.Epoch) <= expiredRev {
						t.Errorf("(b) b acquired shard %d at revision %d, not after a's lease expired at revision %d", id, acq.Epoch, expiredRev)
					}
				}
			}
			// (c)
			checkSingleOwner(t, evs)

			// Heal: a re-attaches, re-registers and owns shards again.
			healed := time.Now()
			for _, p := range proxies {
				p.Clear(t)
			}
			c.waitPartition(rs, 64, 60*time.Second)
			var re *runner.Reattached
			for _, ev := range c.rec.all() {
				if r, ok := ev.(runner.Reattached); ok && r.Runner == "a" && r.Time.After(cut) {
					re = &r
					break
				}
			}
			if re == nil {
				t.Fatal("a owns shards again without a Reattached event")
			}
			if !re.NewLease {
				t.Error("a re-attached on its old lease, which the server had expired")
			}
			for id, e := range a.Owned() {
				if old, ok := before[id]; ok && e <= old {
					t.Errorf("shard %d back on a at epoch %d, not above its pre-cut epoch %d", id, e, old)
				}
			}
			t.Logf("%s: toxic removed at 0; a re-attached at %v and the partition was exact again at %v",
				tc.name, re.Time.Sub(healed).Round(time.Millisecond), time.Since(healed).Round(time.Millisecond))
		})
	}
}
