package runner_test

import (
	"fmt"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2/client"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
)

// TestEtcdCutOffRunnerDetachesBeforeExpiry puts one of two runners behind
// toxiproxy, cuts it off three ways and checks, from events on one clock and
// from etcd revisions:
//
//	(a) it detached before the server deleted its runner key, by at least
//	    DetachMargin/2;
//	(b) the other runner acquired its shards only after that deletion;
//	(c) at no instant did both own a shard;
//
// and that after the toxic is removed it re-attaches, re-registers and owns
// shards again under new epochs.
func TestEtcdCutOffRunnerDetachesBeforeExpiry(t *testing.T) {
	toxics := []struct {
		name  string
		apply func(t *testing.T, p *testenv.Proxy)
	}{
		{"blackhole", func(t *testing.T, p *testenv.Proxy) { p.Blackhole(t) }},
		{"latency-above-ttl", func(t *testing.T, p *testenv.Proxy) {
			// Both directions: requests reach etcd after the lease expired.
			for _, stream := range []string{"upstream", "downstream"} {
				if _, err := p.Raw().AddToxic("lat-"+stream, "latency", stream, 1, toxiproxy.Attributes{"latency": 6000}); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"reset-peer", func(t *testing.T, p *testenv.Proxy) { p.ResetPeer(t) }},
	}
	for _, tc := range toxics {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := testenv.StartEtcd(t)
			tox := testenv.StartToxiproxy(t)
			proxy := tox.Proxy(t, "etcd-"+tc.name, srv.Endpoint())
			c := newCluster(t, []string{srv.Endpoint()}, srv.Client(t))
			const ttl = 5 * time.Second
			cfg := func(id string) runner.Config {
				return runner.Config{ID: id, NumShards: 64, LeaseTTL: ttl}
			}
			a := c.start(cfg("a"), proxy.Addr())
			b := c.start(cfg("b"))
			rs := []*etcdRunner{a, b}
			c.waitPartition(rs, 64, 30*time.Second)
			margin := a.Config().DetachMargin
			deletes := c.watchDeletes("runners/")
			before := a.Owned()
			cut := time.Now()
			tc.apply(t, proxy)

			// B owns everything once A's lease expired on the server.
			waitFor(t, 30*time.Second, "b owns all 64 shards", func() bool { return len(b.Owned()) == 64 })
			expiredAt, expiredRev, ok := deletes.get("a")
			if !ok {
				t.Fatal("a's runner key was never deleted, yet b owns its shards")
			}
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
			gap := expiredAt.Sub(detached.Time)
			t.Logf("%s: cut at 0; a detached at %v (%s); server deleted a's key at %v; gap %v (DetachMargin %v)",
				tc.name, detached.Time.Sub(cut).Round(time.Millisecond), detached.Reason,
				expiredAt.Sub(cut).Round(time.Millisecond), gap.Round(time.Millisecond), margin)
			// (a)
			if gap < margin/2 {
				t.Errorf("(a) a detached only %v before the server expired its lease, want >= DetachMargin/2 = %v", gap, margin/2)
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
			proxy.Clear(t)
			for _, name := range []string{"lat-upstream", "lat-downstream"} {
				_ = proxy.Raw().RemoveToxic(name)
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

// TestEtcdNoFalseDetachWithOneDeadMember: a runner connected to a 3-member
// cluster through one proxy per member stays attached, with the default
// configuration, while one member's proxy black-holes everything.
func TestEtcdNoFalseDetachWithOneDeadMember(t *testing.T) {
	t.Parallel()
	cl := testenv.StartEtcdCluster(t, 3)
	tox := testenv.StartToxiproxy(t)
	var proxies []*testenv.Proxy
	var endpoints []string
	for i, m := range cl.Members() {
		p := tox.Proxy(t, fmt.Sprintf("member-%d", i), m.Endpoint())
		proxies = append(proxies, p)
		endpoints = append(endpoints, p.Addr())
	}
	c := newCluster(t, cl.Endpoints(), cl.Client(t))
	r := c.start(runner.Config{ID: "a", NumShards: 64}, endpoints...)
	c.waitPartition([]*etcdRunner{r}, 64, 30*time.Second)
	proxies[0].Blackhole(t)
	// Two TTLs of the default configuration (15 s), with renewals and
	// verifications landing on the dead member until gRPC drops it.
	const watch = 35 * time.Second
	deadline := time.Now().Add(watch)
	for time.Now().Before(deadline) {
		if st := r.Status(); st.Detached || st.Owned != 64 {
			t.Fatalf("false detach / lost shards with one dead member: %+v", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, ev := range c.rec.all() {
		if d, ok := ev.(runner.Detached); ok {
			t.Fatalf("detached: %+v", d)
		}
	}
	t.Logf("stayed attached with all 64 shards for %v with one of three members black-holed", watch)
}
