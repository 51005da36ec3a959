package lease_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/shardhost/shardhost/lease"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// start runs a keeper on a new memory cluster inside the current bubble.
func start(t *testing.T, cfg lease.Config) (*lease.Keeper, *memory.Store) {
	t.Helper()
	c := memory.NewCluster()
	t.Cleanup(c.Close)
	s := c.NewStore("keeper")
	k, err := lease.New(s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); _ = k.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	if _, err := k.Grant(t.Context()); err != nil {
		t.Fatal(err)
	}
	return k, s
}

func TestRenewsEveryThirdOfTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, s := start(t, lease.Config{TTL: 9 * time.Second})
		h0, _ := k.Health()
		time.Sleep(90*time.Second + time.Millisecond)
		synctest.Wait()
		h, _ := k.Health()
		if !h.Healthy || h.Lost || h.Lease != h0.Lease {
			t.Fatalf("health after 10 TTLs = %+v, want healthy on the first lease", h)
		}
		if got := s.Calls(memory.OpKeepAlive); got != 30 {
			t.Errorf("keep-alives in 90s with TTL 9s = %d, want 30 (every 3s)", got)
		}
		if _, ok := s.Cluster().LeaseTTL(h.Lease); !ok {
			t.Fatal("lease expired although renewed")
		}
		if want := time.Now().Add(9 * time.Second); h.Deadline.After(want) {
			t.Errorf("Deadline %v is after now + TTL %v", h.Deadline, want)
		}
	})
}

// The deadline counts from the send time of the renewal, not from the reply.
func TestDeadlineFromSendTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, s := start(t, lease.Config{TTL: 15 * time.Second})
		s.Delay(memory.OpKeepAlive, 1500*time.Millisecond)
		sent := time.Now().Add(5 * time.Second) // the first renewal
		time.Sleep(5*time.Second + 1600*time.Millisecond)
		synctest.Wait()
		h, _ := k.Health()
		if h.Renewals != 1 {
			t.Fatalf("renewals = %d, want 1", h.Renewals)
		}
		if want := sent.Add(15 * time.Second); !h.Deadline.Equal(want) {
			t.Errorf("Deadline = send + %v, want send + 15s (reply came 1.5s after send)", h.Deadline.Sub(sent))
		}
		// The lease on the server outlives the deadline.
		ttl, ok := s.Cluster().LeaseTTL(h.Lease)
		if !ok || time.Now().Add(ttl).Before(h.Deadline) {
			t.Errorf("server expiry %v before keeper deadline %v", time.Now().Add(ttl), h.Deadline)
		}
	})
}

func TestFailureStreakAndRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, s := start(t, lease.Config{TTL: 15 * time.Second, RetryInterval: 250 * time.Millisecond})
		time.Sleep(5*time.Second + time.Millisecond) // first renewal ok
		synctest.Wait()
		before, _ := k.Health()
		s.FailKeepAlive(true)
		time.Sleep(5 * time.Second) // renewal fails at +10s, retries every 250ms
		synctest.Wait()
		h, changed := k.Health()
		if h.Healthy || h.FailureStreak != 1 || h.Lost || !errors.Is(h.Err, storage.ErrUnavailable) {
			t.Fatalf("after one failure: %+v, want unhealthy, streak 1", h)
		}
		if !h.Deadline.Equal(before.Deadline) {
			t.Fatalf("a failed renewal moved the deadline: %v -> %v", before.Deadline, h.Deadline)
		}
		time.Sleep(1 * time.Second)
		synctest.Wait()
		h, _ = k.Health()
		if h.FailureStreak != 5 {
			t.Fatalf("streak after 1s of 250ms retries = %d, want 5", h.FailureStreak)
		}
		select {
		case <-changed:
		default:
			t.Fatal("Health channel not closed on change")
		}
		s.FailKeepAlive(false)
		time.Sleep(250 * time.Millisecond)
		synctest.Wait()
		h, _ = k.Health()
		if !h.Healthy || h.FailureStreak != 0 || h.Err != nil || !h.Deadline.After(before.Deadline) {
			t.Fatalf("after recovery: %+v, want healthy, streak 0, later deadline", h)
		}
	})
}

func TestLeaseLostAndRegrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, s := start(t, lease.Config{TTL: 6 * time.Second})
		h, _ := k.Health()
		s.Cluster().ExpireLease(h.Lease)
		time.Sleep(2*time.Second + time.Millisecond)
		synctest.Wait()
		lost, _ := k.Health()
		if !lost.Lost || lost.Healthy || !errors.Is(lost.Err, storage.ErrLeaseNotFound) {
			t.Fatalf("after expiry: %+v, want lost with ErrLeaseNotFound", lost)
		}
		calls := s.Calls(memory.OpKeepAlive)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if got := s.Calls(memory.OpKeepAlive); got != calls {
			t.Fatalf("keeper renewed a lost lease %d times", got-calls)
		}
		l, err := k.Grant(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		h, _ = k.Health()
		if h.Lease != l.ID || h.Lost || !h.Healthy {
			t.Fatalf("after Grant: %+v", h)
		}
		time.Sleep(2*time.Second + time.Millisecond)
		synctest.Wait()
		if h, _ = k.Health(); h.Renewals != 1 {
			t.Fatalf("renewals of the new lease = %d, want 1", h.Renewals)
		}
	})
}

// A partitioned client's renewal hangs until CallTimeout; the keeper keeps
// retrying and never extends the deadline.
func TestPartitionHangsUntilCallTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, s := start(t, lease.Config{TTL: 15 * time.Second})
		h0, _ := k.Health()
		s.Partition(true)
		time.Sleep(20 * time.Second)
		synctest.Wait()
		h, _ := k.Health()
		if !h.Deadline.Equal(h0.Deadline) || h.Healthy {
			t.Fatalf("partitioned keeper: %+v, want the grant's deadline and unhealthy", h)
		}
		// Renew at 5s, then each attempt hangs 2s + 250ms pause: ~6 attempts.
		if h.FailureStreak < 5 || h.FailureStreak > 8 {
			t.Errorf("streak = %d after 15s of 2s timeouts", h.FailureStreak)
		}
		s.Partition(false)
		k.RenewNow()
		time.Sleep(time.Millisecond)
		synctest.Wait()
		// The server expired the lease meanwhile: the renewal reports it lost.
		if h, _ = k.Health(); !h.Lost {
			t.Fatalf("after healing past the TTL: %+v, want lost", h)
		}
	})
}

func TestRevoke(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k, s := start(t, lease.Config{TTL: 6 * time.Second})
		h, _ := k.Health()
		if err := k.Revoke(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, ok := s.Cluster().LeaseTTL(h.Lease); ok {
			t.Fatal("lease exists after Revoke")
		}
		if h, _ = k.Health(); !h.Lost {
			t.Fatalf("after Revoke: %+v, want lost", h)
		}
	})
}

func TestConfigValidation(t *testing.T) {
	s := memory.New()
	defer s.Cluster().Close()
	bad := []lease.Config{
		{TTL: 9 * time.Second, RenewInterval: 4 * time.Second},
		{TTL: 9 * time.Second, RetryInterval: 3 * time.Second},
		{TTL: -time.Second},
	}
	for _, cfg := range bad {
		if _, err := lease.New(s, cfg); !errors.Is(err, lease.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
	k, err := lease.New(s, lease.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got := k.Config(); got.TTL != 5*time.Second || got.RenewInterval != 5*time.Second/3 || got.RetryInterval != 250*time.Millisecond || got.CallTimeout != 5*time.Second/3 {
		t.Errorf("defaults = %+v", got)
	}
}
