package testenv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestStartEtcdPutGet(t *testing.T) {
	start := time.Now()
	e := StartEtcd(t)
	t.Logf("StartEtcd ready in %v", time.Since(start).Round(time.Millisecond))

	cli := e.Client(t)
	put(t, cli, "k", "v")
	mustGet(t, cli, "k", "v")
}

// TestLaunchEtcd: the TB-free entry point starts a member in the given
// directory, and Close stops and reaps it.
func TestLaunchEtcd(t *testing.T) {
	SkipIfShort(t, "starts etcd")
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e, err := LaunchEtcd(ctx, dir)
	if err != nil {
		t.Fatalf("LaunchEtcd() error = %v", err)
	}
	t.Cleanup(func() { _ = e.Close() }) // in case the test fails before Close
	if got := filepath.Dir(e.DataDir()); got != dir {
		t.Errorf("DataDir() = %q, want it in %s", e.DataDir(), dir)
	}
	cli := e.Client(t)
	put(t, cli, "k", "v")
	mustGet(t, cli, "k", "v")
	if err := e.Close(); err != nil {
		t.Fatalf("Close() error = %v", err)
	}
	if e.Running() {
		t.Error("Running() = true after Close")
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close() error = %v", err)
	}
}

func TestLaunchEtcdMissingBinary(t *testing.T) {
	t.Setenv(BinEnv, t.TempDir())
	if _, err := BinaryPath("etcd"); err == nil || !strings.Contains(err.Error(), "make setup") {
		t.Errorf("BinaryPath(missing) error = %v, want it to mention `make setup`", err)
	}
	e, err := LaunchEtcd(context.Background(), t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "make setup") {
		if e != nil {
			_ = e.Close()
		}
		t.Errorf("LaunchEtcd() without a binary: error = %v, want it to mention `make setup`", err)
	}
}

func TestEtcdKillRestart(t *testing.T) {
	e := StartEtcd(t)
	endpoint, dataDir := e.Endpoint(), e.DataDir()
	cli := e.Client(t)
	put(t, cli, "k", "before kill")

	e.Kill()
	if e.Running() {
		t.Fatal("Running() = true after Kill")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := cli.Get(ctx, "k")
	cancel()
	if err == nil {
		t.Fatal("Get on a killed member succeeded")
	}

	start := time.Now()
	e.Restart(t)
	t.Logf("Restart ready in %v", time.Since(start).Round(time.Millisecond))
	if e.Endpoint() != endpoint || e.DataDir() != dataDir {
		t.Errorf("after Restart: endpoint %s, data dir %s; want %s, %s", e.Endpoint(), e.DataDir(), endpoint, dataDir)
	}
	// The old client reconnects by itself.
	took := eventually(t, 5*time.Second, 500*time.Millisecond, func(ctx context.Context) error {
		_, err := get(ctx, cli, "k")
		return err
	})
	t.Logf("old client served again %v after Restart", took.Round(time.Millisecond))
	mustGet(t, e.Client(t), "k", "before kill")
}

func TestEtcdPauseResume(t *testing.T) {
	e := StartEtcd(t)
	cli := e.Client(t)
	put(t, cli, "k", "v")

	e.Pause()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := cli.Get(ctx, "k")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Get on a paused member: error = %v, want %v", err, context.DeadlineExceeded)
	}
	e.Resume()
	mustGet(t, cli, "k", "v")
}

func TestEtcdCluster(t *testing.T) {
	start := time.Now()
	c := StartEtcdCluster(t, 3)
	t.Logf("StartEtcdCluster(3) ready in %v", time.Since(start).Round(time.Millisecond))

	if got := len(c.Endpoints()); got != 3 {
		t.Fatalf("len(Endpoints()) = %d, want 3", got)
	}
	// Ready means every member accepts writes at once.
	for _, m := range c.Members() {
		put(t, m.Client(t), "k/"+m.Name(), "v")
	}

	cli := c.Client(t)
	leader := c.Leader(t)
	leader.Kill()
	took := eventually(t, 10*time.Second, 250*time.Millisecond, func(ctx context.Context) error {
		_, err := cli.Put(ctx, "after", "leader killed")
		return err
	})
	t.Logf("first write %v after killing leader %s (tries of 250ms)", took.Round(time.Millisecond), leader.Name())
	if newLeader := c.Leader(t); newLeader == leader {
		t.Errorf("Leader() = killed member %s", leader.Name())
	}

	leader.Restart(t)
	// A restarted member with a quorum running is ready: it serves
	// linearizable reads that include writes made while it was down.
	mustGet(t, leader.Client(t), "after", "leader killed")
}

func TestEtcdClusterRestartWithoutQuorum(t *testing.T) {
	c := StartEtcdCluster(t, 3)
	put(t, c.Client(t), "k", "v")
	for _, m := range c.Members() {
		m.Kill()
	}
	// The first Restart returns once m0 listens (no quorum is running), the
	// second once m0 and m1 are ready, the third once m2 is.
	for _, m := range c.Members() {
		m.Restart(t)
	}
	c.WaitReady(t)
	for _, m := range c.Members() {
		mustGet(t, m.Client(t), "k", "v")
	}
}

func TestWithRaftTimingValidation(t *testing.T) {
	if _, err := newEtcdConfig([]EtcdOption{WithRaftTiming(100*time.Millisecond, 200*time.Millisecond)}); err == nil {
		t.Error("newEtcdConfig(election < 5 × heartbeat) error = nil, want an error")
	}
	c, err := newEtcdConfig(nil)
	if err != nil || c.heartbeat != 50*time.Millisecond || c.election != 500*time.Millisecond || c.logLevel != "error" {
		t.Errorf("newEtcdConfig(nil) = %+v, %v; want 50ms/500ms/error", c, err)
	}
}

// failedTB reports the test as failed and records Logf output.
type failedTB struct {
	testing.TB
	mu   sync.Mutex
	logs strings.Builder
}

func (f *failedTB) Failed() bool { return true }

func (f *failedTB) Logf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fmt.Fprintf(&f.logs, format+"\n", args...)
}

func TestEtcdLogTailOnFailure(t *testing.T) {
	SkipIfShort(t, "starts etcd")
	f := &failedTB{}
	t.Run("inner", func(t *testing.T) {
		f.TB = t
		StartEtcd(f, WithLogLevel("info"))
	})
	f.mu.Lock()
	defer f.mu.Unlock()
	if got := f.logs.String(); !strings.Contains(got, "etcd m0 log tail") || !strings.Contains(got, `"level":"info"`) {
		t.Errorf("cleanup of a failed test logged:\n%s\nwant the tail of etcd's log", got)
	}
}
