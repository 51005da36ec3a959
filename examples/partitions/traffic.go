package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardhost/shardhost/entity"
	"github.com/shardhost/shardhost/runner"
	"github.com/shardhost/shardhost/sharding"
)

// askTimeout bounds each read. A read of a partition with no owner (between
// a plain release and the next acquisition) is retried within it.
const askTimeout = 10 * time.Second

// startProducer appends rate records per second to every partition until
// the returned stop is called; stop returns how many it appended.
func startProducer(l *logService, rate int) (stop func() int64) {
	quit, done := make(chan struct{}), make(chan struct{})
	var appended int64
	go func() {
		defer close(done)
		start := time.Now()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		perPart := int64(0) // appended to each partition so far
		for {
			select {
			case <-quit:
				return
			case <-tick.C:
			}
			due := int64(time.Since(start).Seconds() * float64(rate))
			if n := int(due - perPart); n > 0 {
				for p := range l.parts {
					l.appendRandom(p, n)
				}
				perPart = due
				appended += int64(n * len(l.parts))
			}
		}
	}()
	return func() int64 {
		close(quit)
		<-done
		return appended
	}
}

// sample is one successful read.
type sample struct {
	At       time.Time
	Latency  time.Duration
	Shard    sharding.ShardID
	Runner   string
	Replayed int64
}

// reads is the outcome of the readers.
type reads struct {
	Samples    []sample
	Failed     int
	FailSample string
	// Stale: answered from an offset below the partition's head when the
	// read began (must not happen: Get catches up before answering).
	Stale int
}

// startReaders runs workers that read random keys through the gateway
// until the returned stop is called; stop waits for the reads in flight.
func startReaders(ctx context.Context, gw *runner.Runner, get *entity.MethodRef[Key, GetReq, GetResp], l *logService, workers int) (stop func() reads) {
	quit := make(chan struct{})
	results := make([]reads, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), 7))
			res := &results[w]
			for {
				select {
				case <-quit:
					return
				case <-ctx.Done():
					return
				default:
				}
				key := l.keys[rnd.IntN(len(l.keys))]
				shard := sharding.ShardOf(key, numShards)
				head := l.Head(shard)
				actx, cancel := context.WithTimeout(ctx, askTimeout)
				start := time.Now()
				resp, err := get.Ask(actx, gw, key, GetReq{})
				lat := time.Since(start)
				cancel()
				switch {
				case err != nil:
					res.Failed++
					if res.FailSample == "" {
						res.FailSample = err.Error()
					}
				case resp.Offset < head:
					res.Stale++
				default:
					res.Samples = append(res.Samples, sample{At: start, Latency: lat, Shard: shard, Runner: resp.Runner, Replayed: resp.Replayed})
				}
			}
		})
	}
	return func() reads {
		close(quit)
		wg.Wait()
		var all reads
		for _, r := range results {
			all.Samples = append(all.Samples, r.Samples...)
			all.Failed += r.Failed
			all.Stale += r.Stale
			if all.FailSample == "" {
				all.FailSample = r.FailSample
			}
		}
		slices.SortFunc(all.Samples, func(a, b sample) int { return a.At.Compare(b.At) })
		return all
	}
}

// verify reads every key (traffic stopped) and compares it with the log's
// ground truth. It returns how many keys were equal, and describes the
// first difference.
func verify(ctx context.Context, gw *runner.Runner, get *entity.MethodRef[Key, GetReq, GetResp], l *logService) (exact int, problem string) {
	var n atomic.Int64
	var mu sync.Mutex
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(l.keys); i = int(next.Add(1) - 1) {
				key := l.keys[i]
				actx, cancel := context.WithTimeout(ctx, askTimeout)
				resp, err := get.Ask(actx, gw, key, GetReq{})
				cancel()
				sum, count := l.Truth(key)
				var p string
				switch {
				case err != nil:
					p = fmt.Sprintf("%s: %v", key, err)
				case resp.Sum != sum || resp.Count != count:
					p = fmt.Sprintf("%s: sum %d count %d on %s, the log says %d and %d", key, resp.Sum, resp.Count, resp.Runner, sum, count)
				default:
					n.Add(1)
					continue
				}
				mu.Lock()
				if problem == "" {
					problem = p
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return int(n.Load()), problem
}

// stats summarizes read latencies.
type stats struct {
	N             int
	P50, P99, Max time.Duration
	Slow          int // slower than slowRead
}

// slowRead is the latency above which a read counts as slow.
const slowRead = 50 * time.Millisecond

func statsOf(ss []sample) stats {
	if len(ss) == 0 {
		return stats{}
	}
	lat := make([]time.Duration, len(ss))
	st := stats{N: len(ss)}
	for i, s := range ss {
		lat[i] = s.Latency
		if s.Latency > slowRead {
			st.Slow++
		}
	}
	slices.Sort(lat)
	q := func(f float64) time.Duration { return lat[max(int(math.Ceil(f*float64(len(lat))))-1, 0)] }
	st.P50, st.P99, st.Max = q(0.50), q(0.99), lat[len(lat)-1]
	return st
}
