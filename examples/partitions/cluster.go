package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage/etcd"
)

// startEmbeddedEtcd starts a single-member etcd on free loopback ports with
// its data in a temporary directory. stop closes it and removes the data.
// (The same as the counter demo's.)
func startEmbeddedEtcd(verbose bool) (endpoint string, stop func(), err error) {
	for attempt := 0; ; attempt++ { // a free port may be taken before etcd binds it
		endpoint, stop, err = tryEmbeddedEtcd(verbose)
		if err == nil || attempt == 2 {
			return endpoint, stop, err
		}
	}
}

func tryEmbeddedEtcd(verbose bool) (string, func(), error) {
	dir, err := os.MkdirTemp("", "shardhost-demo-etcd-")
	if err != nil {
		return "", nil, err
	}
	clientURL, err1 := freeURL()
	peerURL, err2 := freeURL()
	if err := errors.Join(err1, err2); err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = "demo"
	cfg.Dir = dir
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{clientURL}, []url.URL{clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{peerURL}, []url.URL{peerURL}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	cfg.TickMs, cfg.ElectionMs = 10, 100
	cfg.LogLevel = "warn"
	if !verbose {
		// Even at level "error" a healthy start and stop log errors.
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("start embedded etcd: %w", err)
	}
	stop := func() {
		e.Close()
		os.RemoveAll(dir)
	}
	select {
	case <-e.Server.ReadyNotify():
		return clientURL.Host, stop, nil
	case err := <-e.Err():
		stop()
		return "", nil, fmt.Errorf("embedded etcd: %w", err)
	case <-time.After(30 * time.Second):
		stop()
		return "", nil, errors.New("embedded etcd not ready after 30s")
	}
}

func freeURL() (url.URL, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return url.URL{}, err
	}
	defer l.Close()
	return url.URL{Scheme: "http", Host: l.Addr().String()}, nil
}

// deleteNamespace removes a run's keys from an external etcd.
func deleteNamespace(endpoint string, namespaces ...string) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, ns := range namespaces {
		_, _ = cli.Delete(ctx, "/"+ns+"/", clientv3.WithPrefix())
	}
}

// stopTimeout bounds waiting for a runner to stop: beyond it the demo
// reports the runner as stuck rather than hanging.
const stopTimeout = 20 * time.Second

// node is one runner with its own etcd client, as it would be in its own
// process, and the handoff events it reported.
type node struct {
	r         *runner.Runner
	cli       *clientv3.Client
	sub       *runner.Subscription
	ran       chan struct{} // closed when Run returned
	runErr    error         // Run's result, set before ran is closed
	collected chan struct{} // closed when the event collector ended

	mu     sync.Mutex
	phases []runner.HandoffPhase

	stopOnce sync.Once
	stopErr  error
}

// startNode connects to etcd, creates the runner with h's hooks (none for
// a client-only runner), registers kind, subscribes to its events and
// starts Run.
func startNode(endpoints []string, namespace string, cfg runner.Config, h *host, kind entity.Descriptor, verbose bool) (*node, error) {
	ccfg := etcd.ClientConfig(endpoints)
	if !verbose {
		ccfg.Logger = zap.NewNop()
	}
	cli, err := clientv3.New(ccfg)
	if err != nil {
		return nil, fmt.Errorf("etcd client for %s: %w", cfg.ID, err)
	}
	store, err := etcd.New(cli, namespace, etcd.Config{})
	if err != nil {
		cli.Close()
		return nil, err
	}
	if h != nil {
		cfg.WarmShard, cfg.ReleaseShard = h.warmShard, h.releaseShard
	}
	r, err := runner.New(store, cfg)
	if err == nil {
		err = r.Register(kind)
	}
	if err != nil {
		cli.Close()
		return nil, fmt.Errorf("runner %s: %w", cfg.ID, err)
	}
	n := &node{r: r, cli: cli, sub: r.Subscribe(), ran: make(chan struct{}), collected: make(chan struct{})}
	go func() {
		defer close(n.collected)
		for ev := range n.sub.Events() {
			if p, ok := ev.(runner.HandoffPhase); ok {
				n.mu.Lock()
				n.phases = append(n.phases, p)
				n.mu.Unlock()
			}
		}
	}()
	go func() {
		defer close(n.ran)
		n.runErr = r.Run(context.Background())
	}()
	return n, nil
}

// handoffPhases returns the handoff events reported so far.
func (n *node) handoffPhases() []runner.HandoffPhase {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.phases)
}

// stop shuts the runner down gracefully, waits for Run, ends the
// subscription and closes the client. Idempotent.
func (n *node) stop(ctx context.Context) error {
	n.stopOnce.Do(func() {
		res := make(chan error, 1)
		go func() {
			err := n.r.Shutdown(ctx)
			<-n.ran
			if n.runErr != nil {
				err = errors.Join(err, fmt.Errorf("%s: Run: %w", n.r.ID(), n.runErr))
			}
			res <- err
		}()
		select {
		case n.stopErr = <-res:
			n.sub.Close()
			<-n.collected
			n.cli.Close()
		case <-time.After(stopTimeout):
			n.stopErr = fmt.Errorf("%s: Shutdown, then Run, did not return within %v", n.r.ID(), stopTimeout)
		}
	})
	return n.stopErr
}

// stopAll stops nodes concurrently and returns how long it took.
func stopAll(nodes []*node) (time.Duration, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = n.stop(ctx) })
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

// waitSettled waits until every live runner owns exactly the shards its
// assignment over the live runners gives it, together all of them, and the
// gateway sees each shard owned by a live runner. It returns the time
// waited.
func waitSettled(ctx context.Context, live []*node, gw *node, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	ids := make([]string, len(live))
	for i, n := range live {
		ids[i] = n.r.ID()
	}
	for {
		if settled(live, ids, gw) {
			return time.Since(start), nil
		}
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("shards not settled on %s after %v: %s", strings.Join(ids, ", "), timeout, ownership(live))
		}
		select {
		case <-ctx.Done():
			return time.Since(start), context.Cause(ctx)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func settled(live []*node, ids []string, gw *node) bool {
	total := 0
	for _, n := range live {
		counts := n.r.Assignment().Counts()
		owned := len(n.r.Owned())
		if len(counts) != len(live) || owned != counts[n.r.ID()] {
			return false
		}
		total += owned
	}
	if total != numShards {
		return false
	}
	for id := range numShards {
		if owner, _ := gw.r.OwnerOf(sharding.ShardID(id)); !slices.Contains(ids, owner) {
			return false
		}
	}
	return true
}

// owners returns the owner of each shard among nodes ("" if none).
func owners(nodes []*node) []string {
	out := make([]string, numShards)
	for _, n := range nodes {
		for id := range n.r.Owned() {
			out[id] = n.r.ID()
		}
	}
	return out
}

// ownership reads "runner-1 8, runner-2 8 shards".
func ownership(nodes []*node) string {
	parts := make([]string, len(nodes))
	for i, n := range nodes {
		parts[i] = fmt.Sprintf("%s %d", n.r.ID(), len(n.r.Owned()))
	}
	return strings.Join(parts, ", ") + " shards"
}

// newLogger is the runners' logger: errors only unless verbose.
func newLogger(w io.Writer, verbose bool) *slog.Logger {
	level := slog.LevelError
	if verbose {
		level = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}
