package etcd_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// proxiedStore returns a store whose client reaches a 3-member cluster
// through one proxy per member, and a lease holding one lock (shard 0).
func proxiedStore(t *testing.T, cfg etcd.Config) (*testenv.ProxiedCluster, *etcd.Store, storage.LeaseID, []storage.Held) {
	t.Helper()
	pc := testenv.StartProxiedEtcdCluster(t, 3)
	s, err := etcd.New(pc.ProxiedClient(t), fmt.Sprintf("hedge-%d", namespaces.Add(1)), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	l, err := s.Grant(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	res, err := s.Acquire(ctx, l.ID, storage.Owner{RunnerID: "r", Incarnation: "1"}, []sharding.ShardID{0})
	if err != nil || res[0].Status != storage.Acquired {
		t.Fatalf("Acquire = %+v, %v", res, err)
	}
	return pc, s, l.ID, []storage.Held{{Shard: 0, Epoch: res[0].Epoch}}
}

// attached runs the calls that keep a runner attached, each within
// budget, and reports the first failure.
func attached(ctx context.Context, s *etcd.Store, id storage.LeaseID, held []storage.Held, budget time.Duration) error {
	cctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	if _, err := s.KeepAliveOnce(cctx, id); err != nil {
		return err
	}
	if lost, err := s.Verify(cctx, id, held); err != nil || len(lost) > 0 {
		return fmt.Errorf("verify: lost %v, %w", lost, err)
	}
	if lost, err := storage.VerifyLease(cctx, s, id, held); err != nil || len(lost) > 0 {
		return fmt.Errorf("verify by lease: lost %v, %w", lost, err)
	}
	// A new owner's first read of a shard's reminders and remembered
	// entities.
	if _, err := s.ReadShardStates(cctx, []sharding.ShardID{held[0].Shard}); err != nil {
		return fmt.Errorf("read shard state: %w", err)
	}
	return s.Ping(cctx)
}

// With the first endpoint's member black-holed (the member a new store
// asks first), renewals, verifications (by lock and by lease keys), reads
// of a shard's state and pings still answer within a
// budget far shorter than a hung call: the next attempt goes through
// another member. Without hedging every call's first attempt would hang
// until its context ends.
func TestHedgedCallsSurviveABlackholedMember(t *testing.T) {
	pc, s, id, held := proxiedStore(t, etcd.Config{})
	pc.Proxies()[0].Blackhole(t)
	for i := range 10 {
		if err := attached(t.Context(), s, id, held, 2*time.Second); err != nil {
			t.Fatalf("round %d with member 0 black-holed: %v", i, err)
		}
	}
	st := s.Stats()
	if st.Hedged == 0 {
		t.Errorf("stats %+v: no call needed a second attempt, yet the first member was black-holed", st)
	}
	// The store sticks to the member that answered: later rounds need no
	// second attempt.
	if st.Hedged > 5 {
		t.Errorf("stats %+v: %d calls hedged, want at most one per kind of call", st, st.Hedged)
	}
	t.Logf("stats with member 0 black-holed: %+v", st)
}

// A paused (SIGSTOP) leader: attempts through it, and through followers
// that still forward to it, hang; attempts that start after the others
// elected a new leader succeed. A renewal with a context of 3 s (the
// runner's defaults give a renewal TTL - margin - interval = 2.5 s; the
// extra is the election on a loaded machine) succeeds.
func TestHedgedRenewalSurvivesAPausedLeader(t *testing.T) {
	pc, s, id, held := proxiedStore(t, etcd.Config{})
	leader := pc.Leader(t)
	leader.Pause()
	defer leader.Resume()
	paused := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	ttl, err := s.KeepAliveOnce(ctx, id)
	if err != nil {
		t.Fatalf("KeepAliveOnce with the leader %s paused: %v (stats %+v)", leader.Name(), err, s.Stats())
	}
	t.Logf("renewed (TTL %v) %v after pausing the leader; stats %+v", ttl, time.Since(paused).Round(time.Millisecond), s.Stats())
	if err := attached(t.Context(), s, id, held, 3*time.Second); err != nil {
		t.Fatalf("with the old leader still paused: %v", err)
	}
}

// Cut off from every member, a hedged call asks each member and fails with
// ErrUnavailable when its context ends; a lease that does not exist is an
// answer, returned at once and not tried elsewhere (one attempt, or one
// more per AttemptTimeout the answer took to come: on a loaded machine the
// first member may answer after the next attempt began).
func TestHedgedCallErrors(t *testing.T) {
	const attemptTimeout = 100 * time.Millisecond
	pc, s, id, _ := proxiedStore(t, etcd.Config{AttemptTimeout: attemptTimeout})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	before := s.Stats()
	start := time.Now()
	if _, err := s.KeepAliveOnce(ctx, id+1); !errors.Is(err, storage.ErrLeaseNotFound) {
		t.Fatalf("KeepAliveOnce(unknown lease) = %v, want ErrLeaseNotFound", err)
	}
	took := time.Since(start)
	if got, most := s.Stats().Attempts-before.Attempts, 1+int64(took/attemptTimeout); got < 1 || got > most {
		t.Errorf("unknown lease took %d attempts in %v, want 1 (at most %d: one more per AttemptTimeout %v the answer took)", got, took.Round(time.Millisecond), most, attemptTimeout)
	}

	for _, p := range pc.Proxies() {
		p.Blackhole(t)
	}
	before = s.Stats()
	cctx, ccancel := context.WithTimeout(t.Context(), time.Second)
	defer ccancel()
	if _, err := s.KeepAliveOnce(cctx, id); !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("KeepAliveOnce cut off from all members = %v, want ErrUnavailable", err)
	}
	st := s.Stats()
	if got := st.Attempts - before.Attempts; got < 3 {
		t.Errorf("cut off from all members: %d attempts, want at least one per member (3)", got)
	}
	if st.Failed-before.Failed != 1 {
		t.Errorf("stats %+v: want one more failed call", st)
	}
}

// Close closes the member connections; the store's hedged calls fail
// afterwards, and closing the client closes them too (goleak checks that
// nothing is left).
func TestCloseMembers(t *testing.T) {
	srv := testenv.StartEtcd(t)
	for _, closeStore := range []bool{true, false} {
		cli, err := clientv3.New(testenv.EtcdClientConfig(srv.Endpoint()))
		if err != nil {
			t.Fatal(err)
		}
		s, err := etcd.New(cli, "close", etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		if err := s.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		if closeStore {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if err := s.Ping(ctx); !errors.Is(err, storage.ErrUnavailable) {
				t.Errorf("Ping after Close = %v, want ErrUnavailable", err)
			}
			if err := s.Close(); err != nil {
				t.Errorf("second Close = %v", err)
			}
		}
		cancel()
		if err := cli.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestClientConfigDropsBlackholedMember measures what etcd.ClientConfig's
// documentation states: how long a client with those settings keeps
// sending requests to a black-holed member (until gRPC keepalive drops the
// connection), with a watch open as a runner always has. It is a
// measurement of about 20 s, run with the long fault variants:
//
//	SHARDHOST_LONG_FAULTS=1 go test -count=1 -run TestClientConfigDropsBlackholedMember -v ./storage/etcd/
func TestClientConfigDropsBlackholedMember(t *testing.T) {
	if os.Getenv("SHARDHOST_LONG_FAULTS") == "" {
		t.Skip("a 20 s measurement; set SHARDHOST_LONG_FAULTS=1")
	}
	pc := testenv.StartProxiedEtcdCluster(t, 3)
	cfg := etcd.ClientConfig(pc.ProxiedEndpoints())
	cfg.Logger = zap.NewNop()
	cli, err := clientv3.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	wctx, wcancel := context.WithCancel(t.Context())
	defer wcancel()
	wch := cli.Watch(wctx, "/drop/", clientv3.WithPrefix())
	go func() {
		for range wch {
		}
	}()
	get := func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
		defer cancel()
		_, err := cli.Get(ctx, "/drop/k")
		return err == nil
	}
	for !get() {
	}
	pc.Proxies()[0].Blackhole(t)
	cut := time.Now()
	var lastFail time.Time
	fails := 0
	for time.Since(cut) < 30*time.Second && (lastFail.IsZero() || time.Since(lastFail) < 5*time.Second) {
		if !get() {
			fails++
			lastFail = time.Now()
		}
		time.Sleep(50 * time.Millisecond)
	}
	if lastFail.IsZero() {
		t.Fatal("no request went to the black-holed member (first endpoint)")
	}
	if time.Since(lastFail) < 5*time.Second {
		t.Fatalf("the client still sent requests to the black-holed member 30 s after the cut")
	}
	t.Logf("MEASURED: the client sent requests to the black-holed member for %v after the cut (%d of them hung 500 ms); then none for 5 s",
		lastFail.Sub(cut).Round(100*time.Millisecond), fails)
}
