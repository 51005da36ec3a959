package lease_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/lease"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// TestDeadlineBeforeServerExpiryThroughToxiproxy cuts the keeper off from a
// real etcd with a black-holing toxic and checks that its deadline minus the
// margin passes before the server deletes a key attached to the lease, as
// seen by a second, unproxied client's watch.
func TestDeadlineBeforeServerExpiryThroughToxiproxy(t *testing.T) {
	srv := testenv.StartEtcd(t)
	tox := testenv.StartToxiproxy(t)
	proxy := tox.Proxy(t, "etcd", srv.Endpoint())
	proxied, err := etcd.New(testenv.NewEtcdClient(t, proxy.Addr()), "lease-toxi", etcd.Config{})
	if err != nil {
		t.Fatal(err)
	}
	direct := srv.Client(t)

	const ttl = 5 * time.Second
	margin := ttl / 3
	k, err := lease.New(proxied, lease.Config{TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	l, err := k.Grant(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := proxied.PutRunner(ctx, l.ID, storage.RunnerRecord{ID: "keeper", Incarnation: "1", Weight: 1})
	if err != nil {
		t.Fatal(err)
	}
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = k.Run(ctx) }()
	defer func() { cancel(); <-runDone }()

	deleted := make(chan time.Time, 1)
	wctx, wcancel := context.WithCancel(ctx)
	defer wcancel()
	wch := direct.Watch(wctx, "/lease-toxi/runners/keeper", clientv3.WithRev(int64(rev)+1))
	go func() {
		for wr := range wch {
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					deleted <- time.Now()
					return
				}
			}
		}
	}()

	// Let a renewal succeed (due every ttl/3), then cut the keeper off.
	h, _ := k.Health()
	for wait := time.Now().Add(ttl); !h.Healthy || h.Renewals < 1; h, _ = k.Health() {
		if time.Now().After(wait) {
			t.Fatalf("before the toxic, %v after the grant: %+v, want a healthy keeper with a renewal", ttl, h)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cut := time.Now()
	proxy.Blackhole(t)

	var at time.Time
	select {
	case at = <-deleted:
	case <-time.After(3 * ttl):
		t.Fatal("the server never deleted the key of the cut-off lease")
	}
	h, _ = k.Health()
	trip := h.Deadline.Add(-margin)
	t.Logf("cut at 0; keeper deadline-margin at %v; server deleted the key at %v; deadline-margin passed %v before the deletion (deadline itself %v before)",
		trip.Sub(cut).Round(time.Millisecond), at.Sub(cut).Round(time.Millisecond),
		at.Sub(trip).Round(time.Millisecond), at.Sub(h.Deadline).Round(time.Millisecond))
	if !trip.Before(at) {
		t.Fatalf("deadline - margin (%v after the cut) did not pass before the server deleted the key (%v after the cut)", trip.Sub(cut), at.Sub(cut))
	}
	if h.Deadline.After(at) {
		t.Errorf("the keeper's deadline (%v after the cut) is later than the server's expiry (%v after the cut)", h.Deadline.Sub(cut), at.Sub(cut))
	}
	if h.Healthy {
		t.Errorf("keeper still healthy after the cut: %+v", h)
	}
}
