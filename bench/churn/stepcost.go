package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// StepCost is what one churn step cost, from its start to its settle.
//
// CPU is measured per process by the kernel (getrusage, /proc/pid/stat),
// split so that a step's own cost is not inflated by the load it is
// measured under: RunnersCPU is the hosting runners' (the harness process
// less its settle polls, or -procs the runner processes), LoadCPU the
// gateway's and the callers' (a child process of their own; -loadproc=false:
// counted with the runners', LoadCPU 0), HarnessCPU the harness's own
// settle polls (timed on the OS thread they run on; -procs: the whole
// harness process), and ChangeCPU = RunnersCPU + EtcdCPU, the change's own
// (EtcdCPU only of an etcd the harness started: 0 with -etcd).
//
// The etcd figures come from its /metrics: Requests counts the unary gRPC
// calls it handled (Range, Txn, Put, DeleteRange, lease grants and
// revokes; not the keep-alive and watch streams), Txns those that were
// transactions, and WatchEvents the events it delivered to watchers
// (etcd_debugging_mvcc_events_total: counted per watch response, one per
// event per watch that matches it, after the watch's filters; a client
// with several watches receives an event once per matching watch).
// The three are -1 when etcd's /metrics did not answer (within 5 s) at
// the step's start or end. Moved is the ownership changes that completed
// in the step (planned moves and crash re-owns, from the runners'
// events); the PerMoved figures divide by it.
type StepCost struct {
	Moved               int     `json:"moved_shards"`
	WatchEvents         float64 `json:"etcd_watch_events"`
	WatchEventsPerMoved float64 `json:"etcd_watch_events_per_moved_shard"`
	Requests            float64 `json:"etcd_requests"`
	RequestsPerMoved    float64 `json:"etcd_requests_per_moved_shard"`
	Txns                float64 `json:"etcd_txns"`
	RunnersCPU          float64 `json:"runners_cpu_s"`
	PerRunner           float64 `json:"runners_cpu_per_runner_ms"` // RunnersCPU / the hosting runners after the step
	EtcdCPU             float64 `json:"etcd_cpu_s,omitempty"`
	ChangeCPU           float64 `json:"change_cpu_s"`
	LoadCPU             float64 `json:"load_cpu_s,omitempty"`
	HarnessCPU          float64 `json:"harness_cpu_s"`
}

// setMoved sets Moved and the figures per moved shard.
func (c *StepCost) setMoved(moved int) {
	c.Moved = moved
	c.WatchEventsPerMoved, c.RequestsPerMoved = 0, 0
	if moved > 0 && c.Requests >= 0 {
		c.WatchEventsPerMoved = c.WatchEvents / float64(moved)
		c.RequestsPerMoved = c.Requests / float64(moved)
	}
}

// summary reads "moved 160; etcd delivered 111829 watch events (698.9 per
// moved shard), handled 646 requests (4.04 per moved shard); CPU: change
// 1.89 s (runners 1.39 s, etcd 0.50 s), callers and gateway 0.80 s,
// harness 0.010 s".
func (c StepCost) summary(p Params) string {
	load := fmt.Sprintf(", callers and gateway %.2f s", c.LoadCPU)
	if p.InProcessLoad && !p.Procs {
		load = " (with the callers and the gateway)"
	}
	return fmt.Sprintf("moved %d; etcd delivered %.0f watch events (%.1f per moved shard), handled %.0f requests (%.2f per moved shard); CPU: change %.2f s (runners %.2f s, etcd %.2f s)%s, harness %.3f s",
		c.Moved, c.WatchEvents, c.WatchEventsPerMoved, c.Requests, c.RequestsPerMoved, c.ChangeCPU, c.RunnersCPU, c.EtcdCPU, load, c.HarnessCPU)
}

// BetweenSteps is the cost of the load while no step is under way (from
// the churn's start, or a step's settle, to the next step's start, and
// from the last one to the end): what the runners, the gateway, the
// callers and etcd spend on asks alone, as rates. A step's RunnersCPU
// includes serving the asks routed to the runners meanwhile; this is the
// measured baseline to hold it against.
type BetweenSteps struct {
	Window            float64 `json:"window_s"` // in all
	RunnersCPUPercent float64 `json:"runners_cpu_percent"`
	EtcdCPUPercent    float64 `json:"etcd_cpu_percent,omitempty"`
	LoadCPUPercent    float64 `json:"load_cpu_percent,omitempty"`
	RequestsPerSec    float64 `json:"etcd_requests_per_s"`
	WatchEventsPerSec float64 `json:"etcd_watch_events_per_s"`

	sum        StepCost // the window's costs summed
	etcdWindow float64  // of Window, where etcd's counters were read
}

// add counts cost c over the interval d.
func (b *BetweenSteps) add(c StepCost, d time.Duration) {
	b.sum.RunnersCPU += c.RunnersCPU
	b.sum.EtcdCPU += c.EtcdCPU
	b.sum.LoadCPU += c.LoadCPU
	b.Window += d.Seconds()
	if c.Requests >= 0 {
		b.sum.Requests += c.Requests
		b.sum.WatchEvents += c.WatchEvents
		b.etcdWindow += d.Seconds()
	}
	if b.Window > 0 {
		pct := func(s float64) float64 { return 100 * s / b.Window }
		b.RunnersCPUPercent, b.EtcdCPUPercent, b.LoadCPUPercent = pct(b.sum.RunnersCPU), pct(b.sum.EtcdCPU), pct(b.sum.LoadCPU)
	}
	if b.etcdWindow > 0 {
		b.RequestsPerSec, b.WatchEventsPerSec = b.sum.Requests/b.etcdWindow, b.sum.WatchEvents/b.etcdWindow
	}
}

// costMark is the counters a step's cost is the difference of.
type costMark struct {
	self  time.Duration         // this process
	polls time.Duration         // of which the settle polls
	procs map[int]time.Duration // -procs: the runner processes
	load  time.Duration         // the load child (-1: none)
	etcd  time.Duration         // -1: not ours
	m     map[string]float64    // etcd's counters (nil: not readable)
}

func (h *harness) markCost(ctx context.Context) costMark { return h.markCostOf(ctx, h.live) }

// markCostOf is markCost with the runners live given (live is the churn
// goroutine's).
func (h *harness) markCostOf(ctx context.Context, live []*node) costMark {
	m, _ := etcdMetrics(ctx, h.etcd.Endpoint) // an etcd without /metrics: no request counts
	return costMark{
		self: processCPU(), polls: time.Duration(h.pollCPU.Load()), procs: procsCPUByPID(live),
		load: h.loadCPU(), etcd: h.etcdCPU(), m: m,
	}
}

// loadCPU returns the CPU time of the load child (-1: the load runs in
// this process, or its CPU is unreadable).
func (h *harness) loadCPU() time.Duration {
	if h.load == nil || h.load.pid() == 0 {
		return -1
	}
	return pidCPU(h.load.pid())
}

// costSince is the cost from mark c0 to now, with runners hosting runners
// after the step. (-procs: a runner process stopped by the step is not
// counted.)
func (h *harness) costSince(ctx context.Context, c0 costMark, runners int) StepCost {
	return h.costBetween(c0, h.markCost(ctx), runners)
}

// costBetween is the cost from mark c0 to mark c1.
func (h *harness) costBetween(c0, c1 costMark, runners int) StepCost {
	self, polls := c1.self-c0.self, c1.polls-c0.polls
	var sc StepCost
	if h.p.Procs {
		sc.RunnersCPU = cpuSince(c0.procs, c1.procs).Seconds()
		sc.HarnessCPU = self.Seconds()
		if c0.load < 0 { // the load is in this process too
			sc.HarnessCPU, sc.LoadCPU = polls.Seconds(), (self - polls).Seconds()
		}
	} else {
		sc.RunnersCPU, sc.HarnessCPU = (self - polls).Seconds(), polls.Seconds()
	}
	if c0.load >= 0 && c1.load >= 0 {
		sc.LoadCPU = (c1.load - c0.load).Seconds()
	}
	if runners > 0 {
		sc.PerRunner = 1000 * sc.RunnersCPU / float64(runners)
	}
	if c0.etcd >= 0 && c1.etcd >= 0 {
		sc.EtcdCPU = (c1.etcd - c0.etcd).Seconds()
	}
	sc.ChangeCPU = sc.RunnersCPU + sc.EtcdCPU
	sc.Requests, sc.Txns, sc.WatchEvents = -1, -1, -1
	if c0.m != nil && c1.m != nil {
		d := func(name string) float64 { return c1.m[name] - c0.m[name] }
		sc.Requests, sc.Txns, sc.WatchEvents = d(metricUnary), d(metricTxns), d(metricWatchEvents)
	}
	return sc
}

// medianCost is the median of each field over costs (the figures per
// moved shard are the medians of each step's, not ratios of medians).
func medianCost(costs []StepCost) StepCost {
	med := func(f func(StepCost) float64) float64 {
		v := make([]float64, len(costs))
		for i, c := range costs {
			v[i] = f(c)
		}
		slices.Sort(v)
		if len(v) == 0 {
			return 0
		}
		return v[len(v)/2]
	}
	return StepCost{
		Moved:               int(med(func(c StepCost) float64 { return float64(c.Moved) })),
		WatchEvents:         med(func(c StepCost) float64 { return c.WatchEvents }),
		WatchEventsPerMoved: med(func(c StepCost) float64 { return c.WatchEventsPerMoved }),
		Requests:            med(func(c StepCost) float64 { return c.Requests }),
		RequestsPerMoved:    med(func(c StepCost) float64 { return c.RequestsPerMoved }),
		Txns:                med(func(c StepCost) float64 { return c.Txns }),
		RunnersCPU:          med(func(c StepCost) float64 { return c.RunnersCPU }),
		PerRunner:           med(func(c StepCost) float64 { return c.PerRunner }),
		EtcdCPU:             med(func(c StepCost) float64 { return c.EtcdCPU }),
		ChangeCPU:           med(func(c StepCost) float64 { return c.ChangeCPU }),
		LoadCPU:             med(func(c StepCost) float64 { return c.LoadCPU }),
		HarnessCPU:          med(func(c StepCost) float64 { return c.HarnessCPU }),
	}
}

// pollThread runs poll on the calling goroutine locked to its OS thread
// and adds the thread's CPU time meanwhile to total (and returns it): what
// the harness's own polling costs, measured rather than guessed, so that
// the process's CPU less it is the runners'.
func pollThread(total *atomic.Int64, poll func()) time.Duration {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	t0 := threadCPU()
	poll()
	d := threadCPU() - t0
	total.Add(int64(d))
	return d
}

// threadCPU returns the CPU time of the calling OS thread.
func threadCPU() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}
