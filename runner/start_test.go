package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/memory"
)

// runAsync starts r.Run in a goroutine, as the README does, and returns
// Run's result channel; cleanup closes the runner.
func runAsync(t *testing.T, r *runner.Runner) chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { r.Close(); <-done })
	return done
}

// runErr waits (fake time in a bubble) for Run's return.
func runErr(t *testing.T, done chan error, d time.Duration) error {
	t.Helper()
	select {
	case err := <-done:
		done <- err // runAsync's cleanup reads it again
		return err
	case <-time.After(d):
		t.Fatalf("Run did not return within %v", d)
		return nil
	}
}

// TestAskRightAfterGoRun: `go r.Run(ctx)` followed at once by an Ask —
// the README's pattern — is answered: a send made before Run has started
// waits for it instead of failing with ErrClosed.
func TestAskRightAfterGoRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		r, err := runner.New(c.NewStore("a"), runner.Config{ID: "a", NumShards: 8, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		go r.Run(ctx) //nolint:errcheck // the README's pattern
		defer r.Close()
		if n, err := k.inc.Ask(ctx, r, "x", incReq{By: 1}); err != nil || n != 1 {
			t.Fatalf("Ask right after go Run = %d, %v; want 1, nil", n, err)
		}
	})
}

// TestSendBeforeRunIsBounded: a send made before Run waits at most until
// its context ends (or RequestTimeout), and fails at once when Shutdown
// came first.
func TestSendBeforeRunIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		r, err := runner.New(c.NewStore("a"), runner.Config{ID: "a", NumShards: 8, RequestTimeout: 10 * time.Second, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		if _, err := k.inc.Ask(short, r, "x", incReq{}); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for Run") {
			t.Errorf("Ask before Run with a 100ms context = %v, want its deadline while waiting for Run", err)
		}
		// Never started: ErrClosed after a second, whatever the context
		// and RequestTimeout (10 s) allow.
		start := time.Now()
		if _, err := k.inc.Ask(context.Background(), r, "x", incReq{}); !errors.Is(err, runner.ErrClosed) || time.Since(start) != time.Second {
			t.Errorf("Ask before Run without a deadline = %v after %v, want ErrClosed after 1s", err, time.Since(start))
		}
		// Run called within the second: the send goes through.
		go func() {
			time.Sleep(500 * time.Millisecond)
			_ = r.Run(t.Context())
		}()
		if _, err := k.inc.Ask(t.Context(), r, "x", incReq{}); err != nil {
			t.Errorf("Ask 500ms before Run = %v, want it served once Run runs", err)
		}
		// Stopped before Run: at once.
		if err := r.Shutdown(t.Context()); err != nil {
			t.Fatal(err)
		}
		start = time.Now()
		if err := k.add.Tell(t.Context(), r, "x", incReq{}); !errors.Is(err, runner.ErrClosed) || time.Since(start) != 0 {
			t.Errorf("Tell after Shutdown = %v after %v, want ErrClosed at once", err, time.Since(start))
		}
	})
}

// endpointStore names endpoints, as the etcd store does.
type endpointStore struct{ *memory.Store }

func (endpointStore) Endpoints() []string { return []string{"10.9.8.7:2379"} }

// TestUnreachableStoreAtStartWarnsOncePerMinute: a runner whose store is
// unreachable logs a WARN naming the endpoints and the error at the first
// failed registration, then one a minute — not one per attempt.
func TestUnreachableStoreAtStartWarnsOncePerMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		s := c.NewStore("a")
		s.Partition(true)
		var lc logCapture
		r, err := runner.New(endpointStore{s}, runner.Config{ID: "a", NumShards: 8, StartTimeout: runner.WaitForever, Logger: lc.logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		runAsync(t, r)
		time.Sleep(3*time.Minute + 30*time.Second)
		var warns []logLine
		for _, l := range lc.all() {
			if l.Level >= slog.LevelWarn {
				warns = append(warns, l)
			}
		}
		if len(warns) < 2 || len(warns) > 4 {
			t.Fatalf("%d WARN lines in 3.5 minutes of failed registrations, want one at once and one a minute: %v", len(warns), warns)
		}
		for _, w := range warns {
			if w.Attrs["endpoints"] != "10.9.8.7:2379" || !strings.Contains(w.Attrs["err"], "unavailable") {
				t.Errorf("WARN %v: want the endpoints and the store's error", w)
			}
		}
		select {
		case <-r.Ready():
			t.Fatal("Ready closed although the runner never registered")
		default:
		}
		s.Partition(false)
		select {
		case <-r.Ready():
		case <-time.After(time.Minute):
			t.Fatal("Ready not closed after the store came back")
		}
		if got := lc.find(slog.LevelInfo, "runner ready"); len(got) != 1 {
			t.Errorf("recovery lines = %v, want one INFO", got)
		}
	})
}

// TestStartTimeoutEndsRun: with StartTimeout, a runner that cannot reach
// its store stops and Run says why.
func TestStartTimeoutEndsRun(t *testing.T) {
	for _, clientOnly := range []bool{false, true} {
		t.Run(map[bool]string{false: "hosting", true: "client-only"}[clientOnly], func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := memory.NewCluster()
				t.Cleanup(c.Close)
				s := c.NewStore("a")
				s.Partition(true)
				r, err := runner.New(s, runner.Config{ID: "a", NumShards: 8, ClientOnly: clientOnly, StartTimeout: 20 * time.Second, Logger: logger(t)})
				if err != nil {
					t.Fatal(err)
				}
				err = runErr(t, runAsync(t, r), time.Minute)
				if !errors.Is(err, runner.ErrStartTimeout) || !errors.Is(err, storage.ErrUnavailable) {
					t.Fatalf("Run = %v, want ErrStartTimeout with the store's error", err)
				}
			})
		})
	}
}

// TestStartTimeoutDefaultsToAMinute: a runner configured without
// StartTimeout that cannot reach its store fails Run with ErrStartTimeout
// after DefaultStartTimeout, as a process supervisor expects of a
// misconfigured process; WaitForever keeps waiting (here ten minutes).
func TestStartTimeoutDefaultsToAMinute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		s := c.NewStore("a")
		s.Partition(true)
		r, err := runner.New(s, runner.Config{ID: "a", NumShards: 8, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		err = runErr(t, runAsync(t, r), 2*runner.DefaultStartTimeout)
		if took := time.Since(start); !errors.Is(err, runner.ErrStartTimeout) || took != runner.DefaultStartTimeout {
			t.Fatalf("Run = %v after %v, want ErrStartTimeout after DefaultStartTimeout (%v)", err, took, runner.DefaultStartTimeout)
		}

		sb := c.NewStore("b")
		sb.Partition(true)
		patient, err := runner.New(sb, runner.Config{ID: "b", NumShards: 8, StartTimeout: runner.WaitForever, Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		done := runAsync(t, patient)
		select {
		case err := <-done:
			t.Fatalf("Run with StartTimeout WaitForever = %v within 10 minutes, want it still waiting", err)
		case <-time.After(10 * time.Minute):
		}
		sb.Partition(false)
		select {
		case <-patient.Ready():
		case err := <-done:
			t.Fatalf("Run = %v once the store is back, want Ready", err)
		case <-time.After(time.Minute):
			t.Fatal("not Ready a minute after the store came back")
		}
	})
}

// TestReadyOnceUp: Ready closes when a hosting runner registered and when a
// client-only runner listed the cluster.
func TestReadyOnceUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		ready := func(r *started) {
			t.Helper()
			select {
			case <-r.Ready():
			case <-time.After(time.Minute):
				t.Fatalf("%s: Ready not closed", r.ID())
			}
		}
		a := start(t, c, nil, runner.Config{ID: "a", NumShards: 8})
		ready(a)
		if st := a.Status(); st.Phase != "attached" || st.Lease == 0 {
			t.Errorf("hosting runner Ready in %+v, want registered (attached, with a lease)", st)
		}
		gw := start(t, c, nil, runner.Config{ID: "gw", NumShards: 8, ClientOnly: true})
		ready(gw)
		if st := gw.Status(); st.Members != 1 {
			t.Errorf("client-only runner Ready in %+v, want the runners listed (1 member)", st)
		}
	})
}

// TestNoOwnerErrorsSayWhy: a send that finds no owner says why: the
// cluster was never listed (with the store's error), or no runner is
// registered, or (a gateway with a full lock view) the lock is held under
// the lease of no registered runner.
func TestNoOwnerErrorsSayWhy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := newTestKind(false)
		c := memory.NewCluster()
		t.Cleanup(c.Close)
		gw := start(t, c, nil, runner.Config{ID: "gw", NumShards: 8, ClientOnly: true, FullLockView: true})
		if err := gw.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		<-gw.Ready()
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err := k.inc.Ask(ctx, gw, "x", incReq{})
		if !errors.Is(err, runner.ErrNoOwner) || !strings.Contains(err.Error(), "no runner is registered in the cluster") {
			t.Errorf("Ask with no runner = %v, want ErrNoOwner saying no runner is registered", err)
		}

		s := c.NewStore("gw2")
		s.Partition(true)
		gw2 := startOn(t, s, nil, runner.Config{ID: "gw2", NumShards: 8, ClientOnly: true})
		if err := gw2.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		ctx, cancel = context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		_, err = k.inc.Ask(ctx, gw2, "x", incReq{})
		if !errors.Is(err, runner.ErrNoOwner) || !strings.Contains(err.Error(), "has not listed the cluster's runners yet") ||
			!strings.Contains(err.Error(), "last store failure") {
			t.Errorf("Ask on a cut-off gateway = %v, want ErrNoOwner saying it has not listed the cluster, with the store's failure", err)
		}

		// A registered runner that cannot take its shards: they are
		// assigned to it, not acquired.
		hs := c.NewStore("h")
		hs.Fail(memory.OpAcquire, errors.New("injected acquire failure"))
		h := startOn(t, hs, nil, runner.Config{ID: "h", NumShards: 8, DisableDetachment: true})
		if err := h.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		<-h.Ready()
		ctx, cancel = context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		_, err = k.inc.Ask(ctx, h, "x", incReq{})
		if !errors.Is(err, runner.ErrNoOwner) || !strings.Contains(err.Error(), `assigned to "h", which has not acquired it`) ||
			!strings.Contains(err.Error(), "this send waited (1 runners registered") {
			t.Errorf("Ask of a shard its assignee cannot acquire = %v, want ErrNoOwner naming the assignee and the wait", err)
		}

		// A lock left under the lease of a runner that is gone (no record).
		ghost := c.NewStore("ghost")
		l, err := ghost.Grant(t.Context(), time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ghost.Acquire(t.Context(), l.ID, storage.Owner{RunnerID: "ghost", Incarnation: "1"}, []sharding.ShardID{sharding.ShardOf("y", 8)}); err != nil {
			t.Fatal(err)
		}
		ctx, cancel = context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		_, err = k.inc.Ask(ctx, gw, "y", incReq{})
		if !errors.Is(err, runner.ErrNoOwner) || !strings.Contains(err.Error(), fmt.Sprintf("held under lease %x, of no registered runner", l.ID)) {
			t.Errorf("Ask of a shard locked by a gone runner = %v, want ErrNoOwner naming the lease", err)
		}
	})
}
