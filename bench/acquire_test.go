package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
	"github.com/shardhost/shardhost/storage"
	"github.com/shardhost/shardhost/storage/etcd"
)

// txnCounter counts etcd Txn RPCs leaving the client.
type txnCounter struct{ n atomic.Int64 }

func (c *txnCounter) interceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if method == "/etcdserverpb.KV/Txn" {
		c.n.Add(1)
	}
	return invoker(ctx, method, req, reply, cc, opts...)
}

func countingClient(b *testing.B, endpoint string, c *txnCounter) *clientv3.Client {
	cfg := testenv.EtcdClientConfig(endpoint)
	cfg.DialOptions = append(cfg.DialOptions, grpc.WithChainUnaryInterceptor(c.interceptor))
	cli, err := clientv3.New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cli.Close() })
	return cli
}

// BenchmarkAcquireCold: one runner starts on an empty namespace and owns all
// 4096 shards; time from Run to the last ShardAcquired.
func BenchmarkAcquireCold(b *testing.B) {
	const shards = 4096
	srv := testenv.StartEtcd(b)
	var txns txnCounter
	cli := countingClient(b, srv.Endpoint(), &txns)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	i := 0
	var total time.Duration
	for b.Loop() {
		i++
		s, err := etcd.New(cli, fmt.Sprintf("cold-%d", i), etcd.Config{})
		if err != nil {
			b.Fatal(err)
		}
		r, err := runner.New(s, runner.Config{ID: "r", NumShards: shards, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		sub := r.Subscribe()
		before := txns.n.Load()
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- r.Run(context.Background()) }()
		got := 0
		for ev := range sub.Events() {
			if _, ok := ev.(runner.ShardAcquired); ok {
				if got++; got == shards {
					break
				}
			}
		}
		total += time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(txns.n.Load()-before), "txns/op")
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		if err := r.Shutdown(ctx); err != nil {
			b.Fatal(err)
		}
		cancel()
		<-done
		sub.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(i), "ms-to-own-all/op")
}

// BenchmarkAcquireBatch4096: the storage call alone, 4096 free shards.
func BenchmarkAcquireBatch4096(b *testing.B) {
	const shards = 4096
	srv := testenv.StartEtcd(b)
	var txns txnCounter
	cli := countingClient(b, srv.Endpoint(), &txns)
	ids := make([]sharding.ShardID, shards)
	for i := range ids {
		ids[i] = sharding.ShardID(i)
	}
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		b.StopTimer()
		s, err := etcd.New(cli, fmt.Sprintf("batch-%d", i), etcd.Config{})
		if err != nil {
			b.Fatal(err)
		}
		l, err := s.Grant(ctx, time.Minute)
		if err != nil {
			b.Fatal(err)
		}
		before := txns.n.Load()
		b.StartTimer()
		res, err := s.Acquire(ctx, l.ID, storage.Owner{RunnerID: "r", Incarnation: "1"}, ids)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		for _, r := range res {
			if r.Status != storage.Acquired {
				b.Fatalf("shard %d: %v", r.Shard, r.Status)
			}
		}
		b.ReportMetric(float64(txns.n.Load()-before), "txns/op")
		if err := s.Revoke(ctx, l.ID); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
