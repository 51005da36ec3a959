package runner_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// TestRunFailsOnAServerWithTooFewStreams: on an etcd started with
// --max-concurrent-streams 1, a call cannot get a stream while the
// watches' is open; Run fails at once with a *storage.StreamLimitError
// naming the flag and the streams a runner needs, hosting or client-only,
// instead of retrying calls that time out. With 2 the runner starts.
func TestRunFailsOnAServerWithTooFewStreams(t *testing.T) {
	t.Parallel()
	run := func(limit int, cfg runner.Config) (error, bool) {
		srv := testenv.StartEtcd(t, testenv.WithEtcdArgs("--max-concurrent-streams", strconv.Itoa(limit)))
		s, err := etcd.New(testenv.NewEtcdClient(t, srv.Endpoint()), "streams", etcd.Config{})
		if err != nil {
			t.Fatal(err)
		}
		cfg.NumShards, cfg.Logger, cfg.StartTimeout = 8, logger(t), time.Minute
		r, err := runner.New(s, cfg)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		select {
		case err := <-done:
			return err, false
		case <-r.Ready():
			r.Close()
			<-done
			return nil, true
		case <-time.After(30 * time.Second):
			r.Close()
			<-done
			return nil, false
		}
	}
	for _, cfg := range []runner.Config{{ID: "hosting"}, {ID: "client", ClientOnly: true}} {
		err, ready := run(1, cfg)
		var limit *storage.StreamLimitError
		if ready || !errors.As(err, &limit) || !errors.Is(err, storage.ErrStreamLimit) || limit.Needed != 2 ||
			!strings.Contains(err.Error(), "--max-concurrent-streams") {
			t.Errorf("%s runner on etcd --max-concurrent-streams 1: Run = %v (ready %v), want a *storage.StreamLimitError naming --max-concurrent-streams and 2 streams", cfg.ID, err, ready)
		}
	}
	if err, ready := run(2, runner.Config{ID: "hosting"}); !ready {
		t.Errorf("hosting runner on etcd --max-concurrent-streams 2: Run = %v before it was ready", err)
	}
}
