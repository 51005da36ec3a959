package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/shardhost/shardhost/runner"
)

// benchRegister: registrations from handlers at p.rate a second.
func benchRegister(ctx context.Context, p params, w io.Writer) error {
	e, err := newEnv(ctx, p)
	if err != nil {
		return err
	}
	defer e.close()
	active.rec = e.rec
	n, err := e.start("r1", runner.Config{})
	if err != nil {
		return err
	}
	if _, err := e.waitOwned(ctx, time.Minute); err != nil {
		return err
	}
	var mu sync.Mutex
	var lat []time.Duration
	failed := 0
	var wg sync.WaitGroup
	every := time.Second / time.Duration(p.rate)
	start := time.Now()
	for i := 0; time.Since(start) < p.duration; i++ {
		due := start.Add(time.Duration(i) * every)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			d, err := register.Ask(cctx, n.r, fmt.Sprint("reg", i), registerReq{Period: time.Hour})
			cancel()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				failed++
				return
			}
			lat = append(lat, d)
		})
	}
	wg.Wait()
	took := time.Since(start)
	p50, p99, mx := quantiles(lat)
	fmt.Fprintf(w, "   %d registrations in %v (%.0f/s asked, %.0f/s done), %d failed; Register latency p50 %s, p99 %s, max %s\n",
		len(lat), took.Round(time.Millisecond), float64(p.rate), float64(len(lat))/took.Seconds(), failed, ms(p50), ms(p99), ms(mx))
	// The floor: the same etcd, one conditional transaction (a compare
	// and a put, as a registration's) per request at the same rate,
	// straight from a client.
	raw := rawTxns(ctx, e, p.rate, p.duration)
	p50, p99, mx = quantiles(raw)
	fmt.Fprintf(w, "   floor: %d raw etcd transactions (compare + put) at %d/s: p50 %s, p99 %s, max %s\n", len(raw), p.rate, ms(p50), ms(p99), ms(mx))
	return nil
}

// rawTxns sends rate conditional transactions a second to e's etcd for d
// and returns their latencies.
func rawTxns(ctx context.Context, e *env, rate int, d time.Duration) []time.Duration {
	var mu sync.Mutex
	var out []time.Duration
	var wg sync.WaitGroup
	every := time.Second / time.Duration(rate)
	start := time.Now()
	for i := 0; time.Since(start) < d; i++ {
		if w := time.Until(start.Add(time.Duration(i) * every)); w > 0 {
			time.Sleep(w)
		}
		wg.Go(func() {
			key := fmt.Sprintf("/%s/floor/%d", e.ns, i)
			t0 := time.Now()
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := e.cli.Txn(cctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).Then(clientv3.OpPut(key, "x")).Commit()
			cancel()
			if err == nil {
				mu.Lock()
				out = append(out, time.Since(t0))
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return out
}

// benchFire: one runner firing n reminders a second, for each n.
func benchFire(ctx context.Context, p params, w io.Writer) error {
	for _, size := range p.fire {
		if err := fireOnce(ctx, p, size, w); err != nil {
			return err
		}
	}
	return nil
}

func fireOnce(ctx context.Context, p params, size int, w io.Writer) error {
	e, err := newEnv(ctx, p)
	if err != nil {
		return err
	}
	defer e.close()
	active.rec = e.rec
	// Due from 5 s after now (after the load), spread over each second.
	base := time.Now().Add(5 * time.Second)
	if err := e.put(ctx, e.reminders(size, func(i int) time.Time {
		return base.Add(time.Duration(i) * time.Second / time.Duration(size))
	}, time.Second)); err != nil {
		return err
	}
	if _, err := e.start("r1", runner.Config{}); err != nil {
		return err
	}
	if _, err := e.waitOwned(ctx, time.Minute); err != nil {
		return err
	}
	if d := time.Until(base.Add(2 * time.Second)); d > 0 { // every entity activated once
		time.Sleep(d)
	}
	e.rec.mu.Lock()
	e.rec.sample, e.rec.lags = true, nil
	e.rec.mu.Unlock()
	before, t0 := e.rec.count(), time.Now()
	var cpu0 runtime.MemStats
	runtime.ReadMemStats(&cpu0)
	time.Sleep(p.duration)
	fires, took := e.rec.count()-before, time.Since(t0)
	e.rec.mu.Lock()
	e.rec.sample = false
	p50, p99, mx := quantiles(e.rec.lags)
	e.rec.mu.Unlock()
	fmt.Fprintf(w, "   %d reminders due %d/s on one runner: %.0f fires/s over %v; fire lag p50 %s, p99 %s, max %s (loaded %d)\n",
		size, size, float64(fires)/took.Seconds(), took.Round(time.Millisecond), ms(p50), ms(p99), ms(mx), e.loaded())
	return nil
}

// benchSteady: etcd writes while p.steady reminders fire every second on
// p.runners runners.
func benchSteady(ctx context.Context, p params, w io.Writer) error {
	e, err := newEnv(ctx, p)
	if err != nil {
		return err
	}
	defer e.close()
	active.rec = e.rec
	base := time.Now().Add(10 * time.Second)
	if err := e.put(ctx, e.reminders(p.steady, func(i int) time.Time {
		return base.Add(time.Duration(i) * time.Second / time.Duration(p.steady))
	}, time.Second)); err != nil {
		return err
	}
	for i := range p.runners {
		if _, err := e.start(fmt.Sprint("r", i+1), runner.Config{}); err != nil {
			return err
		}
	}
	cold, err := e.waitOwned(ctx, 2*time.Minute)
	if err != nil {
		return err
	}
	if d := time.Until(base.Add(5 * time.Second)); d > 0 {
		time.Sleep(d)
	}
	r0, err := e.revision(ctx)
	if err != nil {
		return err
	}
	f0, t0 := e.rec.count(), time.Now()
	time.Sleep(p.duration)
	r1, err := e.revision(ctx)
	if err != nil {
		return err
	}
	fires, took := e.rec.count()-f0, time.Since(t0)
	fmt.Fprintf(w, "   %d reminders every 1 s on %d runners (owned all %d shards %v after the start): %.0f fires/s; etcd revisions %d -> %d over %v: %.2f writes/s\n",
		p.steady, p.runners, p.shards, cold.Round(time.Millisecond), float64(fires)/took.Seconds(), r0, r1, took.Round(time.Millisecond), float64(r1-r0)/took.Seconds())
	return nil
}

// benchStored: the cost of p.stored stored reminders: database size, cold
// start, load time, memory.
func benchStored(ctx context.Context, p params, w io.Writer) error {
	coldWithout, err := coldStart(ctx, p, 0, w)
	if err != nil {
		return err
	}
	coldWith, err := coldStart(ctx, p, p.stored, w)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "   cold start of %d runners with %d reminders stored: all shards owned in %v, %.2fx the %v without\n",
		p.runners, p.stored, coldWith.Round(time.Millisecond), float64(coldWith)/float64(coldWithout), coldWithout.Round(time.Millisecond))
	return nil
}

func coldStart(ctx context.Context, p params, stored int, w io.Writer) (time.Duration, error) {
	e, err := newEnv(ctx, p)
	if err != nil {
		return 0, err
	}
	defer e.close()
	active.rec = e.rec
	if stored > 0 {
		t0 := time.Now()
		far := time.Now().Add(time.Hour)
		if err := e.put(ctx, e.reminders(stored, func(int) time.Time { return far }, time.Hour)); err != nil {
			return 0, err
		}
		st, err := e.cli.Status(ctx, e.etcd.Endpoint())
		if err != nil {
			return 0, err
		}
		cnt, err := e.cli.Get(ctx, "/"+e.ns+"/reminders/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return 0, err
		}
		fmt.Fprintf(w, "   %d reminders written in %v; etcd database %.1f MiB (%.0f bytes per reminder), %d keys counted\n",
			stored, time.Since(t0).Round(time.Millisecond), float64(st.DbSize)/(1<<20), float64(st.DbSize)/float64(stored), cnt.Count)
	}
	runtime.GC()
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	start := time.Now()
	for i := range p.runners {
		if _, err := e.start(fmt.Sprint("r", i+1), runner.Config{}); err != nil {
			return 0, err
		}
	}
	cold, err := e.waitOwned(ctx, 3*time.Minute)
	if err != nil {
		return 0, err
	}
	if stored == 0 {
		fmt.Fprintf(w, "   cold start of %d runners, %d shards, no reminder: all shards owned in %v\n", p.runners, p.shards, cold.Round(time.Millisecond))
		return cold, nil
	}
	for e.loaded() < int64(stored) {
		if time.Since(start) > 5*time.Minute {
			return 0, fmt.Errorf("%d of %d reminders loaded after 5 min", e.loaded(), stored)
		}
		time.Sleep(10 * time.Millisecond)
	}
	loadedIn := time.Since(start)
	runtime.GC()
	var m1 runtime.MemStats
	runtime.ReadMemStats(&m1)
	fmt.Fprintf(w, "   every reminder loaded %v after the start; heap %+.1f MiB for %d reminders: %.0f bytes per reminder (the runners' whole heap growth)\n",
		loadedIn.Round(time.Millisecond), float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc))/(1<<20), stored, float64(int64(m1.HeapAlloc)-int64(m0.HeapAlloc))/float64(stored))
	return cold, nil
}

// benchMoves: planned moves and a crash under reminder load, checked tick
// by tick.
func benchMoves(ctx context.Context, p params, w io.Writer) error {
	e, err := newEnv(ctx, p)
	if err != nil {
		return err
	}
	defer e.close()
	active.rec = e.rec
	e.rec.keep = true
	base := time.Now().Add(5 * time.Second)
	if err := e.put(ctx, e.reminders(p.moving, func(i int) time.Time {
		return base.Add(time.Duration(i) * time.Second / time.Duration(p.moving))
	}, time.Second)); err != nil {
		return err
	}
	const runners = 4
	for i := range runners {
		if _, err := e.start(fmt.Sprint("r", i+1), runner.Config{}); err != nil {
			return err
		}
	}
	if _, err := e.waitOwned(ctx, time.Minute); err != nil {
		return err
	}
	time.Sleep(time.Until(base.Add(3 * time.Second)))
	steps := []struct {
		what string
		do   func() error
	}{
		{"join r5", func() error { _, err := e.start("r5", runner.Config{}); return err }},
		{"graceful shutdown r2", func() error { return e.nodes[1].shutdown() }},
		{"join r6", func() error { _, err := e.start("r6", runner.Config{}); return err }},
	}
	var planned []time.Time
	for _, s := range steps {
		planned = append(planned, time.Now())
		if err := s.do(); err != nil {
			return fmt.Errorf("%s: %w", s.what, err)
		}
		d, err := e.waitOwned(ctx, time.Minute)
		if err != nil {
			return fmt.Errorf("after %s: %w", s.what, err)
		}
		fmt.Fprintf(w, "   %s: settled in %v\n", s.what, d.Round(time.Millisecond))
		time.Sleep(2 * time.Second)
	}
	crashAt := time.Now()
	victim := e.nodes[2]
	victim.close() // a crash: nothing released, the lease runs out
	d, err := e.waitOwned(ctx, time.Minute)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "   crash r3: re-owned in %v\n", d.Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	e.rec.mu.Lock()
	defer e.rec.mu.Unlock()
	var fires, dupPlanned, lostPlanned, redelivered, dupCrash int
	var worst time.Duration
	for _, fs := range e.rec.seqs {
		fires += len(fs)
		for i := 1; i < len(fs); i++ {
			prev, f := fs[i-1], fs[i]
			switch {
			case f.redelivered:
				redelivered++
				if f.tick <= prev.tick {
					dupCrash++
				}
				if f.at.After(crashAt) && prev.at.Before(crashAt) {
					worst = max(worst, f.at.Sub(crashAt))
				}
			case f.tick <= prev.tick:
				dupPlanned++
			case f.tick != prev.tick+f.missed+1:
				lostPlanned += int(f.tick - prev.tick - f.missed - 1)
			}
		}
	}
	fmt.Fprintf(w, "   %d reminders every 1 s, %d ticks fired: across %d planned moves %d ticks fired twice and %d lost; after the crash %d fires redelivered (%d of them a tick fired before), the crashed runner's reminders firing again within %v of the crash\n",
		p.moving, fires, len(planned), dupPlanned, lostPlanned, redelivered, dupCrash, worst.Round(time.Millisecond))
	return nil
}
