package runner_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// TestEtcdDownAtStart: a runner started while its etcd is down logs a WARN
// naming the endpoint and the error, is not Ready, and becomes Ready (and
// serves) once etcd is up; with StartTimeout, Run gives up and says why.
func TestEtcdDownAtStart(t *testing.T) {
	srv := testenv.StartEtcd(t)
	srv.Stop()
	k := newTestKind(false)
	newRunner := func(cfg runner.Config) *runner.Runner {
		t.Helper()
		s, err := etcd.New(testenv.NewEtcdClient(t, srv.Endpoint()), "down-at-start", etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		r, err := runner.New(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Register(k.kind); err != nil {
			t.Fatal(err)
		}
		return r
	}

	var lc logCapture
	timed := newRunner(runner.Config{ID: "timed", NumShards: 8, StartTimeout: 2 * time.Second, OpTimeout: 500 * time.Millisecond, Logger: lc.logger(t)})
	if err := timed.Run(context.Background()); !errors.Is(err, runner.ErrStartTimeout) || !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("Run with etcd down and StartTimeout 2s = %v, want ErrStartTimeout with the store's error", err)
	}
	warns := lc.find(slog.LevelWarn, "cannot start")
	if len(warns) != 1 || warns[0].Attrs["endpoints"] != srv.Endpoint() || warns[0].Attrs["err"] == "" {
		t.Fatalf("WARN lines = %v, want one naming endpoint %s and the error", warns, srv.Endpoint())
	}
	if errs := lc.find(slog.LevelError, "StartTimeout"); len(errs) != 1 || !strings.Contains(errs[0].Attrs["err"], "StartTimeout") {
		t.Fatalf("ERROR lines = %v, want one saying why Run stopped", errs)
	}

	r := newRunner(runner.Config{ID: "patient", NumShards: 8, OpTimeout: 500 * time.Millisecond, Logger: logger(t)})
	done := make(chan error, 1)
	go func() { done <- r.Run(context.Background()) }()
	t.Cleanup(func() { r.Close(); <-done })
	select {
	case <-r.Ready():
		t.Fatal("Ready with etcd down")
	case <-time.After(time.Second):
	}
	srv.Restart(t)
	select {
	case <-r.Ready():
	case err := <-done:
		t.Fatalf("Run = %v before it was ready", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not Ready 30s after etcd came up")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if n, err := k.inc.Ask(ctx, r, "x", incReq{By: 1}); err != nil || n != 1 {
		t.Fatalf("Ask once ready = %d, %v", n, err)
	}
}
