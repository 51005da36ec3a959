package bench

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/internal/testenv"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/storage/etcd"
)

// account is the entity of BenchmarkCheckpoint: a balance kept in memory
// and, in per-write mode, checkpointed by every deposit before it answers.
type account struct {
	balance    int64
	checkpoint func(context.Context, []byte) error // ActivateInfo.Checkpoint
	perWrite   bool
}

type depositReq struct{ Amount int64 }

func (a *account) Activate(_ context.Context, info entity.ActivateInfo) error {
	a.checkpoint = info.Checkpoint
	return nil
}

func (a *account) Release(ctx context.Context, info entity.ReleaseInfo) error {
	return info.Checkpoint(ctx, binary.BigEndian.AppendUint64(nil, uint64(a.balance)))
}

func (a *account) Deposit(ctx context.Context, r depositReq) (int64, error) {
	a.balance += r.Amount
	if a.perWrite {
		// Durable before it is acknowledged: one fenced etcd transaction.
		if err := a.checkpoint(ctx, binary.BigEndian.AppendUint64(nil, uint64(a.balance))); err != nil {
			a.balance -= r.Amount
			return 0, err
		}
	}
	return a.balance, nil
}

// BenchmarkCheckpoint compares the two ways to keep an entity's state in
// etcd (see the README, State and persistence): a checkpoint written by
// every write before it is acknowledged (per-write), and a checkpoint
// written only when the entity is released (on-release: the writes
// themselves touch memory only). One runner owning 64 shards on a real
// single-member etcd; each caller asks its own entity.
func BenchmarkCheckpoint(b *testing.B) {
	srv := testenv.StartEtcd(b)
	cli := srv.Client(b)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	n := 0
	for _, perWrite := range []bool{false, true} {
		mode := map[bool]string{false: "on-release", true: "per-write"}[perWrite]
		kind := entity.NewKind("account-"+mode, func(string) *account { return &account{perWrite: perWrite} })
		deposit := entity.Method(kind, "deposit", (*account).Deposit)
		for _, callers := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/callers=%d", mode, callers), func(b *testing.B) {
				n++
				s, err := etcd.New(cli, fmt.Sprintf("checkpoint-%d", n), etcd.Config{})
				if err != nil {
					b.Fatal(err)
				}
				r, err := runner.New(s, runner.Config{ID: "r", NumShards: 64, Logger: quiet})
				if err != nil {
					b.Fatal(err)
				}
				if err := r.Register(kind); err != nil {
					b.Fatal(err)
				}
				done := make(chan error, 1)
				go func() { done <- r.Run(context.Background()) }()
				defer func() {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					_ = r.Shutdown(ctx)
					<-done
				}()
				ctx := context.Background()
				for i := range callers { // warm: every entity active, every shard owned
					if _, err := deposit.Ask(ctx, r, fmt.Sprintf("acct-%d", i), depositReq{Amount: 1}); err != nil {
						b.Fatal(err)
					}
				}
				for len(r.Owned()) < 64 {
					time.Sleep(10 * time.Millisecond)
				}
				var (
					left = make(chan struct{}, 1024)
					mu   sync.Mutex
					lat  []time.Duration
					fail atomic.Value
				)
				b.ResetTimer()
				go func() {
					for range b.N {
						left <- struct{}{}
					}
					close(left)
				}()
				var wg sync.WaitGroup
				for i := range callers {
					wg.Go(func() {
						id := fmt.Sprintf("acct-%d", i)
						var mine []time.Duration
						for range left {
							start := time.Now()
							if _, err := deposit.Ask(ctx, r, id, depositReq{Amount: 1}); err != nil {
								fail.Store(err)
								return
							}
							mine = append(mine, time.Since(start))
						}
						mu.Lock()
						lat = append(lat, mine...)
						mu.Unlock()
					})
				}
				wg.Wait()
				b.StopTimer()
				if err, _ := fail.Load().(error); err != nil {
					b.Fatal(err)
				}
				slices.Sort(lat)
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "asks/s")
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			})
		}
	}
}
