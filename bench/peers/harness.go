package main

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/wrapperspb"
)

// skipError carries the reason a system does not run a scenario; the table
// prints the reason instead of a figure.
type skipError struct{ reason string }

func (e *skipError) Error() string { return "skipped: " + e.reason }

func skip(format string, args ...any) error { return &skipError{fmt.Sprintf(format, args...)} }

// local is one actor system running in this process, started for one
// measurement and closed after it.
type local interface {
	// Tell sends n one-way increments to one actor and returns once the
	// actor has processed all of them (an ask after the tells reads n).
	Tell(n int) error
	asker
	// Activate creates n new actors (entities), each processing one
	// one-way message, and returns once all n have processed it; they
	// stay resident (idle) until Close.
	Activate(n int) error
	Close()
}

// asker runs callers against actors: Ask calls loop once, in the caller's
// own context, with ask, which makes one request-response exchange with
// the actor (or connection) of the caller's id and checks the answer.
// Ask returns loop's error.
type asker interface {
	Ask(id int, loop func(ask func() error) error) error
}

// remote is a pair of nodes (or a cluster) on loopback TCP: asks go from
// one process-local node to actors hosted by another.
type remoteNodes interface {
	asker
	Close()
}

// system is one contender: constructors for its local and remote modes;
// a nil constructor is a mode it lacks (skipReason says why).
type system struct {
	name        string
	newLocal    func() (local, error)
	newRemote   func() (remoteNodes, error)
	localSkip   string // why newLocal is nil
	remoteSkip  string // why newRemote is nil
	remoteLabel string // what its remote mode is ("cluster", "remote", ...)
	maxEntities int    // > 0: at most this many actors in the activation scenario
	entitiesWhy string // why maxEntities
}

// counterCheck checks the answers of one caller's asks: every adapter's
// actor adds the request's amount (1) to its count and answers the new
// count, so the n-th ask of a caller must read n.
type counterCheck struct{ want int64 }

// check verifies the count the actor returned after an increment by one.
func (c *counterCheck) check(got int64) error {
	c.want++
	if got != c.want {
		return fmt.Errorf("actor answered count %d, want %d", got, c.want)
	}
	return nil
}

// counter is the state of the counter actor of the systems that exchange
// protobuf messages: a tell (Int64Value) adds to it and is counted in
// tally when tally is set; an ask (UInt64Value) adds and is answered with
// the new count.
type counter struct {
	n     int64
	tally *atomic.Int64
}

// receive applies msg and returns the answer to an ask (nil for a tell or
// anything else).
func (c *counter) receive(msg any) *wrapperspb.Int64Value {
	switch m := msg.(type) {
	case *wrapperspb.Int64Value: // tell
		c.n += m.Value
		if c.tally != nil {
			c.tally.Add(1)
		}
	case *wrapperspb.UInt64Value: // ask
		c.n += int64(m.Value)
		return wrapperspb.Int64(c.n)
	}
	return nil
}

// checkedLoop runs loop with asks that each increment a counter actor by
// one through ask, which returns the count the actor answered, and fails
// at the first answer that is not the count expected.
func checkedLoop(loop func(ask func() error) error, ask func() (int64, error)) error {
	var c counterCheck
	return loop(func() error {
		got, err := ask()
		if err != nil {
			return err
		}
		return c.check(got)
	})
}

// metric is one row of the table.
type metric struct {
	name   string
	unit   string
	higher bool // higher is better
}

// scenario is one measurement that yields one or more metrics.
type scenario struct {
	name    string
	remote  bool
	metrics []metric
	// run measures once on a fresh local (l) or remote (r) system and
	// returns a value per metric name.
	run func(cfg config, l local, r remoteNodes) (map[string]float64, error)
}

// config holds the command's knobs.
type config struct {
	duration time.Duration // per throughput measurement
	entities int           // actors created by the activation scenario
}

// measureAsks runs callers concurrent callers for d, each with its own
// actor, and returns asks/s plus the p50 and p99 latency in µs.
func measureAsks(a asker, callers int, d time.Duration, latency bool) (rate, p50, p99 float64, err error) {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		lat   []time.Duration
		total atomic.Int64
		errs  = make([]error, callers)
		start = make(chan struct{})
		stop  atomic.Bool
	)
	ready := make(chan struct{}, callers)
	for i := range callers {
		wg.Go(func() {
			errs[i] = a.Ask(i, func(ask func() error) error {
				if err := ask(); err != nil { // warm: activate, connect
					ready <- struct{}{}
					return err
				}
				ready <- struct{}{}
				<-start
				local := make([]time.Duration, 0, 4096)
				n := 0
				for !stop.Load() {
					t0 := time.Now()
					if err := ask(); err != nil {
						return err
					}
					if latency {
						local = append(local, time.Since(t0))
					}
					n++
				}
				total.Add(int64(n))
				mu.Lock()
				lat = append(lat, local...)
				mu.Unlock()
				return nil
			})
		})
	}
	for range callers {
		<-ready
	}
	t0 := time.Now()
	close(start)
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(t0)
	if err := errors.Join(errs...); err != nil {
		return 0, 0, 0, err
	}
	rate = float64(total.Load()) / elapsed.Seconds()
	if latency && len(lat) > 0 {
		slices.Sort(lat)
		p50 = float64(lat[len(lat)/2].Nanoseconds()) / 1e3
		p99 = float64(lat[len(lat)*99/100].Nanoseconds()) / 1e3
	}
	return rate, p50, p99, nil
}

// measureTell sends tells in batches for about d and returns msgs/s
// counted until the actor processed the last one.
func measureTell(l local, d time.Duration) (float64, error) {
	const batch = 1 << 16
	n := 0
	t0 := time.Now()
	for time.Since(t0) < d {
		if err := l.Tell(batch); err != nil {
			return 0, err
		}
		n += batch
	}
	return float64(n) / time.Since(t0).Seconds(), nil
}

// measureActivate creates n actors and returns activations/s and the heap
// bytes each idle one keeps (after GC).
func measureActivate(l local, n int) (rate, perEntity float64, err error) {
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	t0 := time.Now()
	if err := l.Activate(n); err != nil {
		return 0, 0, err
	}
	rate = float64(n) / time.Since(t0).Seconds()
	time.Sleep(100 * time.Millisecond) // let activation goroutines settle
	runtime.GC()
	runtime.ReadMemStats(&after)
	return rate, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n), nil
}

// waitCount polls get until it returns want or the deadline passes.
func waitCount(get func() (int64, error), want int64, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		got, err := get()
		if err != nil {
			return err
		}
		if got == want {
			return nil
		}
		if got > want {
			return fmt.Errorf("count %d passed the %d sent", got, want)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("count %d of %d after %v", got, want, within)
		}
		time.Sleep(time.Millisecond)
	}
}

var (
	mTell       = metric{"tell", "msgs/s", true}
	mAsk1       = metric{"ask, 1 caller", "asks/s", true}
	mAsk64      = metric{"ask, 64 callers", "asks/s", true}
	mActivate   = metric{"activation", "actors/s", true}
	mIdleHeap   = metric{"heap per idle actor", "B", false}
	mRemoteP50  = metric{"remote ask, 1 caller, p50", "µs", false}
	mRemoteP99  = metric{"remote ask, 1 caller, p99", "µs", false}
	mRemoteRate = metric{"remote ask, 64 callers", "asks/s", true}
)

func scenarios() []scenario {
	ask := func(callers int, m metric) func(config, local, remoteNodes) (map[string]float64, error) {
		return func(cfg config, l local, _ remoteNodes) (map[string]float64, error) {
			rate, _, _, err := measureAsks(l, callers, cfg.duration, false)
			return map[string]float64{m.name: rate}, err
		}
	}
	return []scenario{
		{name: "tell", metrics: []metric{mTell}, run: func(cfg config, l local, _ remoteNodes) (map[string]float64, error) {
			v, err := measureTell(l, cfg.duration)
			return map[string]float64{mTell.name: v}, err
		}},
		{name: "ask1", metrics: []metric{mAsk1}, run: ask(1, mAsk1)},
		{name: "ask64", metrics: []metric{mAsk64}, run: ask(64, mAsk64)},
		{name: "activate", metrics: []metric{mActivate, mIdleHeap}, run: func(cfg config, l local, _ remoteNodes) (map[string]float64, error) {
			rate, heap, err := measureActivate(l, cfg.entities)
			return map[string]float64{mActivate.name: rate, mIdleHeap.name: heap}, err
		}},
		{name: "remote1", remote: true, metrics: []metric{mRemoteP50, mRemoteP99}, run: func(cfg config, _ local, r remoteNodes) (map[string]float64, error) {
			_, p50, p99, err := measureAsks(r, 1, cfg.duration, true)
			return map[string]float64{mRemoteP50.name: p50, mRemoteP99.name: p99}, err
		}},
		{name: "remote64", remote: true, metrics: []metric{mRemoteRate}, run: func(cfg config, _ local, r remoteNodes) (map[string]float64, error) {
			rate, _, _, err := measureAsks(r, 64, cfg.duration, false)
			return map[string]float64{mRemoteRate.name: rate}, err
		}},
	}
}
